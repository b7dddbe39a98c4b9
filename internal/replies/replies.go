// Package replies is the rule of where a service may answer a request: only on a reply subject in
// the inbox space its callers are given (the shipped NATS users subscribe to "_INBOX.>" and
// nothing else for answers). A request whose reply subject is anything else (a stream's subject:
// prompt.composed.>, deadletter.>, $KV.<bucket>.>) would make the service publish there with its
// own permissions on the caller's behalf, a confused deputy; it is refused, said and counted
// instead (docs/security.md). The shipped configuration has the server enforce the same rule on
// the connection that serves requests (deploy/nats/nats.conf, COMPOSER_API).
package replies

import (
	"fmt"
	"strings"
)

// DefaultPrefixes are the inbox spaces of nats.go's requests (nats.CustomInboxPrefix changes it).
const DefaultPrefixes = "_INBOX."

// Inboxes is the set of reply subject prefixes a service answers on.
type Inboxes struct {
	prefixes []string
}

// Parse reads a comma-separated list of prefixes, each ending in "." and free of wildcards and
// blanks (like "_INBOX." or "_INBOX_orch."), so that a prefix names a subject space, not a part
// of one token.
func Parse(list string) (Inboxes, error) {
	var in Inboxes
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !strings.HasSuffix(p, ".") || len(p) < 2 || strings.ContainsAny(p, "*> \t\r\n") {
			return Inboxes{}, fmt.Errorf("%q is not a subject prefix ending in \".\" without wildcards (like %q)", p, DefaultPrefixes)
		}
		in.prefixes = append(in.prefixes, p)
	}
	if len(in.prefixes) == 0 {
		return Inboxes{}, fmt.Errorf("names no prefix (like %q)", DefaultPrefixes)
	}
	return in, nil
}

// Allows says whether a service may answer on reply: a subject below one of the prefixes, of
// tokens that are not empty.
func (in Inboxes) Allows(reply string) bool {
	for _, p := range in.prefixes {
		// Tokens, each not empty and no wildcard (an answer to "_INBOX.>" would reach every
		// pending request of every client).
		if rest, ok := strings.CutPrefix(reply, p); ok && rest != "" && !strings.Contains(rest, "..") && !strings.HasSuffix(rest, ".") &&
			!strings.ContainsAny(rest, "*> \t\r\n") {
			return true
		}
	}
	return false
}

// String lists the prefixes as Parse reads them.
func (in Inboxes) String() string { return strings.Join(in.prefixes, ",") }

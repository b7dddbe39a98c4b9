package events

import (
	"fmt"
	"strconv"
	"strings"
)

// Reference is a template reference as a request names one: NAME, NAME@VERSION or NAME:LABEL.
// ParseReference is its one rule; what a reference resolves to is compose.Library.Lookup's.
type Reference struct {
	Name    string
	Version int    // NAME@VERSION; 0 otherwise
	Label   string // NAME:LABEL (latest is the highest version); "" otherwise
}

// ParseReference reads a template reference: NAME and LABEL are identifiers, VERSION a positive
// number written plainly (no sign, no leading zero). NAME@latest is refused: latest is a label.
func ParseReference(s string) (Reference, error) {
	name, rest, sep := s, "", byte(0)
	if i := strings.IndexAny(s, "@:"); i >= 0 {
		name, rest, sep = s[:i], s[i+1:], s[i]
	}
	if !ValidIdentifier(name) {
		return Reference{}, fmt.Errorf("template reference %s: the name must be letters, digits, '_' and '-'", Quote(s))
	}
	r := Reference{Name: name}
	switch sep {
	case '@':
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 || strconv.Itoa(n) != rest {
			return Reference{}, fmt.Errorf("template reference %s: a version is a positive number (a label is NAME:LABEL, NAME:latest the highest version)", Quote(s))
		}
		r.Version = n
	case ':':
		if !ValidIdentifier(rest) {
			return Reference{}, fmt.Errorf("template reference %s: a label must be letters, digits, '_' and '-'", Quote(s))
		}
		r.Label = rest
	}
	return r, nil
}

// String writes the reference as ParseReference reads it.
func (r Reference) String() string {
	switch {
	case r.Version > 0:
		return r.Name + "@" + strconv.Itoa(r.Version)
	case r.Label != "":
		return r.Name + ":" + r.Label
	}
	return r.Name
}

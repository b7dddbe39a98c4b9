package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// An action on a stream, bucket or consumer is the publishes it takes: it is allowed
// when the server lets every one of them through. The subjects are the JetStream API's and the
// streams' own; a payload that is not JSON makes every API request that passes the permission fail
// harmlessly, and the test starts no service, so nothing it tries changes anything.
type action struct {
	name     string
	subjects []string
}

// cellObject is a row of the roles table: one stream, bucket or consumer.
type cellObject struct {
	name    string
	actions []action
}

// roleObjects are the rows of the roles table in docs/operating.md, with what each action takes.
// consumer is the name a role gives a consumer of its own.
func roleObjects(role string) []cellObject {
	own := "cells-" + role
	stream := func(name, api string, publish ...string) cellObject {
		o := cellObject{name: name}
		if len(publish) > 0 {
			o.actions = append(o.actions, action{"publish", publish})
		}
		return o.with(api, own, !strings.HasPrefix(api, "KV_"))
	}
	const digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	durable := func(name, api, d string) cellObject {
		return cellObject{name: name, actions: []action{
			{"create", []string{"$JS.API.CONSUMER.CREATE." + api + "." + d, "$JS.API.CONSUMER.CREATE." + api + "." + d + ".its.filter"}},
			{"pull", []string{"$JS.API.CONSUMER.MSG.NEXT." + api + "." + d}},
			{"ack", []string{"$JS.ACK." + api + "." + d + ".1.1.1.1.1"}},
			{"delete", []string{"$JS.API.CONSUMER.DELETE." + api + "." + d}},
		}}
	}
	return []cellObject{
		stream("EVALUATIONS", "EVALUATIONS", "evaluation.completed.cells.t1"),
		stream("ROUNDS", "ROUNDS", "round.requested.cells.t1"),
		stream("PROMPTS", "PROMPTS", "prompt.composed.cells.t1", "prompt.failed.cells.t1"),
		stream("LEADERBOARDS", "LEADERBOARDS", "leaderboard.updated.cells"),
		stream("DEADLETTER", "DEADLETTER", "deadletter.evaluation.completed.cells.t1"),
		stream("AUDIT", "AUDIT", "audit.checkpoint.prompts"),
		stream("TEMPLATES", "KV_TEMPLATES", "$KV.TEMPLATES.cells.v1", "$KV.TEMPLATES.cells.label.staging").
			first(action{"release", []string{"$KV.TEMPLATES.cells.label.production", "$KV.TEMPLATES.cells.pin.production." + digest}}),
		stream("BUILDERS", "KV_BUILDERS", "$KV.BUILDERS.cells.v1", "$KV.BUILDERS.cells.label.staging").
			first(action{"release", []string{"$KV.BUILDERS.cells.label.production", "$KV.BUILDERS.cells.pin.production." + digest}}),
		stream("SCORES", "KV_SCORES", "$KV.SCORES.cells"),
		stream("ANSWERED", "KV_ANSWERED", "$KV.ANSWERED.cells"),
		stream("RANKER_PASSES", "KV_RANKER_PASSES", "$KV.RANKER_PASSES.cells"),
		stream("BUILDER_MODULES", "BUILDER_MODULES", "builders.modules."+digest),
		stream("BUILDER_RELEASES", "BUILDER_RELEASES", "builders.releases."+digest),
		durable("the ranker's durable", "EVALUATIONS", "ranker"),
		durable("the composer's durable", "ROUNDS", "composer"),
		durable("the archiver's durable", "PROMPTS", "archiver"),
		durable("an orchestrator's durable", "PROMPTS", "orchestrator-waits"),
	}
}

// with adds the actions every stream has, on the stream api, for a consumer named own. A bucket is
// read by direct gets, and watched (a push consumer of one's own); any other stream is read by
// direct gets, and consumed (a consumer of one's own, pulled and acknowledged).
func (o cellObject) with(api, own string, events bool) cellObject {
	o.actions = append(o.actions, action{"read", []string{"$JS.API.DIRECT.GET." + api, "$JS.API.STREAM.MSG.GET." + api}})
	if !events {
		o.actions = append(o.actions, action{"watch", []string{"$JS.API.CONSUMER.CREATE." + api + "." + own}})
	} else {
		o.actions = append(o.actions, action{"consume", []string{"$JS.API.CONSUMER.CREATE." + api + "." + own, "$JS.API.CONSUMER.MSG.NEXT." + api + "." + own, "$JS.ACK." + api + "." + own + ".1.1.1.1.1"}})
	}
	o.actions = append(o.actions,
		action{"create", []string{"$JS.API.STREAM.CREATE." + api}},
		action{"update", []string{"$JS.API.STREAM.UPDATE." + api}},
		action{"purge", []string{"$JS.API.STREAM.PURGE." + api}},
		action{"delete", []string{"$JS.API.STREAM.DELETE." + api}},
	)
	return o
}

// first puts a (a bucket's release) after the object's publish.
func (o cellObject) first(a action) cellObject {
	o.actions = slices.Insert(o.actions, 1, a)
	return o
}

// rolesTable reads the roles table of docs/operating.md: by object, by role, the actions allowed.
func rolesTable(t *testing.T) (roles []string, cells map[string]map[string][]string) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cells = map[string]map[string][]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "<!-- roles table -->"):
			in = true
			continue
		case strings.Contains(line, "<!-- end of the roles table -->"):
			return roles, cells
		case !in || !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---"):
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cols {
			cols[i] = strings.Trim(strings.TrimSpace(cols[i]), "`")
		}
		if roles == nil {
			roles = cols[1:]
			continue
		}
		row := map[string][]string{}
		for i, role := range roles {
			if cols[i+1] != "–" {
				row[role] = strings.Fields(cols[i+1])
			}
		}
		cells[cols[0]] = row
	}
	t.Fatal("docs/operating.md has no roles table (<!-- roles table --> ... <!-- end of the roles table -->)")
	return nil, nil
}

// TestEveryRoleCell starts NATS from deploy/nats/nats.conf as shipped and tries every action of
// every row of docs/operating.md's roles table as every role: an action the table does not list
// must be refused by the server, and every one it lists let through. With PODIUM_ROLES_PRINT=1 it
// prints the table as the server answers it.
func TestEveryRoleCell(t *testing.T) {
	t.Parallel()
	ns := shippedNATS(t)
	roles, cells := rolesTable(t)
	if !slices.Equal(roles, natsRoles) {
		t.Errorf("the table's roles are %v, deploy/nats/nats.conf's %v", roles, natsRoles)
		roles = natsRoles
	}
	observed := map[string]map[string][]string{}
	var names []string
	for _, role := range roles {
		nc, _ := connectAs(t, ns, role)
		for _, o := range roleObjects(role) {
			if observed[o.name] == nil {
				observed[o.name] = map[string][]string{}
				names = append(names, o.name)
			}
			for _, a := range o.actions {
				var let, refused []string
				for _, subject := range a.subjects {
					if permitted(t, nc, subject) {
						let = append(let, subject)
					} else {
						refused = append(refused, subject)
					}
				}
				if len(let) > 0 && len(refused) > 0 {
					t.Errorf("%s: %s on %s is half allowed: %v let through, %v refused", role, a.name, o.name, let, refused)
				}
				allowed := len(refused) == 0
				if allowed {
					observed[o.name][role] = append(observed[o.name][role], a.name)
				}
				if want := slices.Contains(cells[o.name][role], a.name); want != allowed {
					t.Errorf("%s: %s on %s: the table says allowed=%v, the server %v", role, a.name, o.name, want, allowed)
				}
			}
		}
	}
	if !slices.Equal(names, sortedKeys(cells, names)) {
		t.Errorf("the table's rows are %v, the test tries %v", sortedKeys(cells, nil), names)
	}
	if os.Getenv("PODIUM_ROLES_PRINT") != "" || t.Failed() {
		var b strings.Builder
		fmt.Fprintf(&b, "| | %s |\n|---%s|\n", strings.Join(quoted(roles), " | "), strings.Repeat("|---", len(roles)))
		for _, name := range names {
			fmt.Fprintf(&b, "| %s |", name)
			for _, role := range roles {
				if got := observed[name][role]; len(got) > 0 {
					fmt.Fprintf(&b, " %s |", strings.Join(got, " "))
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
		t.Logf("the roles table as the server answers it:\n%s", b.String())
	}
}

// permitted publishes to subject and reports whether the server let it through: a refusal is
// sent before the flush's answer, and names the subject.
func permitted(t *testing.T, nc *nats.Conn, subject string) bool {
	t.Helper()
	before := nc.LastError()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: nc.NewRespInbox(), Data: []byte("not json")}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	err := nc.LastError()
	return err == before || err == nil || !strings.Contains(err.Error(), `"`+subject+`"`)
}

// sortedKeys are the keys of m in the order of want, then any other.
func sortedKeys(m map[string]map[string][]string, want []string) []string {
	var out []string
	for _, k := range want {
		if _, ok := m[k]; ok {
			out = append(out, k)
		}
	}
	for k := range m {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "`" + s + "`"
	}
	return out
}

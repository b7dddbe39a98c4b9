package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/podium-llm/podium/pkg/events"
)

// command is one subcommand: who it is for, its usage, a line for `podium help`, what its
// --help says, and its flags with what it does once they are parsed.
type command struct {
	audience, name, args, short, what string
	flags                             func(fs *flag.FlagSet) func(ctx context.Context, e *env) error
}

// checkArgs holds args to the command's usage, before it runs (arityOf).
func (c command) checkArgs(args []string) error {
	least, most, alternatives := arityOf(c.args)
	if !alternatives && (len(args) < least || (most >= 0 && len(args) > most)) {
		return usagef("usage: podium %s %s", c.name, c.args)
	}
	return nil
}

// arityOf reads how many arguments a usage line takes, so that the line --help prints is the
// rule: each word outside brackets and parentheses that is neither a flag nor a flag's value is
// one; one ending in "..." may repeat (most < 0: no limit). A "|" outside brackets means
// alternatives, which the command tells apart itself from its flags.
func arityOf(usage string) (least, most int, alternatives bool) {
	depth, flagValue := 0, false
	for _, word := range strings.Fields(usage) {
		outside := depth == 0
		depth += strings.Count(word, "[") + strings.Count(word, "(") - strings.Count(word, "]") - strings.Count(word, ")")
		switch {
		case !outside:
		case word == "|":
			alternatives = true
		case strings.HasPrefix(word, "-"):
			flagValue = true
			continue
		case flagValue || strings.HasPrefix(word, "[") || strings.HasPrefix(word, "("):
		case strings.HasSuffix(word, "..."):
			least, most = least+1, -1
		default:
			least++
		}
		flagValue = false
	}
	if most >= 0 {
		most = least
	}
	return least, most, alternatives
}

// The audiences of `podium help`, in its order.
const (
	authors   = "Template authors"
	auditors  = "Auditors"
	operators = "Operators"
)

// commands is the one table of podium's commands: `podium help`, the commands that take a
// subcommand (groups), each command's --help and docs/cli-reference.md are all made from it.
func commands() []command {
	return []command{
		{authors, "templates push", "DIR|FILE [--label L]", "store the next version of a template (checked first)",
			"Push a template folder or .mustache file as the next version of its name; it is checked as composers check templates and refused with its line and variable.", templatesPush},
		{authors, "templates list", "", "the registry's templates, versions and labels",
			"List the registry's templates, versions and labels.", templatesList},
		{authors, "templates show", "NAME[@V|:LABEL]", "the files of a version",
			"Print the files of a version.", templatesShow},
		{authors, "templates history", "NAME", "a name's versions and label moves",
			"List a name's versions and label moves, in order.", templatesHistory},
		{authors, "templates diff", "A B", "unified diff of two versions' sources",
			"Print a unified diff of two versions' sources (NAME@V, NAME:LABEL).", templatesDiff},
		{authors, "templates label", "NAME VERSION[@DIGEST][=WEIGHT]... LABEL", "move a label, or split it between versions by weight",
			"Point a label at a version (a release, or a rollback), or split it between versions by weight (5=50 6=50): each team is served one of them, chosen from its execution and team, and keeps it for its whole execution, also when the weights change. production is what a bare name renders. The label names each version with the sha256 of its document, printed here; VERSION@DIGEST refuses a version that is no longer the document reviewed.", templatesLabel},
		{authors, "templates render", "NAME --request FILE [--evaluations FILE] [--time T] [--json]", "render offline, no server",
			"Render offline, without any server: a built-in template or a template folder or file being written.", templatesRender},
		{authors, "templates try", "NAME@VERSION|NAME:LABEL|NAME (--execution EXEC | --last N) [--json] [--diff]", "a dry run of a candidate on recorded requests",
			"Render recorded requests again with a candidate template, each as of its own evaluations_seq, and publish nothing: per request the tokens and cuts before and after, or the failure and its code; a summary of how many would fail and how the size moves; --diff prints each prompt's diff.", templatesTry},
		{authors, "templates compare", "NAME [--execution E]... [--baseline V] [--since T] [--until T] [--json]", "which version of a template helps teams, where the data can say",
			"Per version of a template: its teams and executions, prompts, failed and unevaluated requests, and the mean score of its teams with a 95% interval; then each version against the baseline (the production label's version) among the teams a split label randomized between the two in the same executions, blocked by execution: the difference, its interval and p-value (Holm over the comparisons), and a verdict with its reason: better, worse, inconclusive (the interval holds 0), no difference (the interval lies within --margin), not enough data (under 5 teams of either), attrition differs (the versions lost teams before the last round, or left them unevaluated, at clearly different rates), fails more (its requests failed clearly more often), interim (an execution is not finished: verdicts wait for the end) or not randomized (figures only); and whether a verdict holds for executions like these (4 or more, the effect's variation between them counted) or these executions only. Lower is better where the requests' score_order says asc. The method: docs/templates.md.", templatesCompare},
		{authors, "templates import-mixseek", "prompt_builder.toml [--name N] [--out DIR | --push [--label L]]", "convert mixseek-core's Jinja2 team template",
			"Convert the team template of a mixseek-core prompt_builder.toml (its Jinja2 subset: {{ var }}, if round_number > 1, if ranking_table, else, endif) into a Mustache template; anything else is refused with its line and construct.", templatesImportMixseek},
		{authors, "builders push", "FILE.wasm --name NAME --models GLOB [--models GLOB]... [--priority N] [--label L]", "store the next version of a prompt builder (loaded first)",
			"Push a WebAssembly prompt builder (docs/builders.md) as the next version of NAME, serving the models its globs match; it is loaded as composers load it and refused if it cannot be. It serves nothing until labelled production.", buildersPush},
		{authors, "builders label", "NAME VERSION[@DIGEST] LABEL", "move a builder's label: production serves it",
			"Point a label of a builder at a version: production makes it build every request whose model its globs match (a release, or a rollback), and copies its module into BUILDER_RELEASES. The label names the version with the sha256 of its document, printed here; VERSION@DIGEST refuses a version that is no longer the document reviewed.", buildersLabel},
		{authors, "builders list", "", "the registry's builders, their models, priorities and labels, and what they see",
			"List every builder version: its sha256, size, model globs, priority and labels; and what a builder is handed.", buildersList},
		{authors, "builders parse", "MODEL [--timeout D]", "split a model's output (stdin) as its builder does",
			"Send the model's output on stdin to podium.parse: the production builder of MODEL splits it into its final answer and tool requests, printed as JSON.", buildersParse},

		{auditors, "prompts show", "EXEC TEAM ROUND [--json]", "the recorded prompt of a team's round and what it was made from",
			"Print the recorded prompt of a team's round and what it was made from.", promptsShow},
		{auditors, "prompts verify", "EXEC TEAM ROUND | --all --execution EXEC | --bundle FILE", "render records again from themselves and compare (sha256)",
			"Render each record again from its request, template version and evaluations_seq (from a bundle: with no NATS and no ClickHouse); exit 1 naming the first that differs.", promptsVerify},
		{auditors, "prompts diff", "EXEC TEAM ROUND1 ROUND2", "unified diff of a team's prompts of two rounds",
			"Print a unified diff of a team's prompts of two rounds.", promptsDiff},
		{auditors, "prompts tail", "[--execution E] [--team T] [--all] [--count N]", "follow the audit stream",
			"Print each prompt.composed and prompt.failed as it is recorded.", promptsTail},
		{auditors, "export", "--execution EXEC [--out FILE]", "one execution's evaluations, prompts and templates in one bundle",
			"Write one execution's bundle: its evaluations, its prompt records byte for byte and the files of every template version they name, which `prompts verify --bundle` proves offline.", export},

		{auditors, "audit check", "[--key PUBLIC_KEY] [--since CHECKPOINT_FILE] [--json]", "prove the audit log whole: signed, only grown, stream and archive alike",
			"Check the audit log over PROMPTS with nothing but its public key (--key or AUDIT_PUBLIC_KEY): every checkpoint in AUDIT is signed by it, each extends the one before (and the one given with --since: a checkpoint kept from an earlier check), and PROMPTS and the archive hold exactly the records the signed tree holds; exit 1 naming each record deleted, changed, inserted or reordered with its position. Prints the latest checkpoint to keep. docs/audit.md.", auditCheck},
		{operators, "audit keygen", "NAME [--out FILE]", "make the audit log's signing key",
			"Make an ed25519 signing key for the audit log named NAME: the private key into FILE (mode 0600, never overwritten) for the archiver's ARCHIVER_AUDIT_SIGNING_KEY_FILE, the public key printed for auditors. docs/audit.md.", auditKeygen},
		{operators, "leaderboard", "EXEC [--asc] [--json]", "an execution's standings, as the ranker computes them",
			"Print an execution's standings, every evaluation counted, as the ranker computes them.", leaderboard},
		{operators, "history", "EXEC TEAM [--json]", "a team's latest evaluation of each round",
			"Print a team's latest evaluation of each round.", history},
		{operators, "publish evaluation", "--file F [--id ID]", "publish an evaluation.completed, validated first",
			"Publish an evaluation.completed: F holds its data object or a whole CloudEvent; it is validated first.", publish(events.TypeEvaluationCompleted)},
		{operators, "publish round", "--file F [--id ID]", "publish a round.requested, validated first",
			"Publish a round.requested: F holds its data object or a whole CloudEvent; it is validated first.", publish(events.TypeRoundRequested)},
		{operators, "deadletters list", "[--subject S]", "what was dead-lettered, with the reasons",
			"List the DEADLETTER stream: sequence, original subject, reason, where the original is.", deadlettersList},
		{operators, "deadletters replay", "SEQ | --all", "republish dead-lettered originals that are now valid, under a new message id",
			"Republish dead-lettered originals that are valid now (after a fix), under a new message id; refuse, saying why, those still invalid.", deadlettersReplay},
		{operators, "streams apply", "[--dry-run]", "show how each stream and bucket differs from the configuration, and apply it",
			"Show how each stream and key-value bucket differs from what the configuration owns of it (podium's environment: PROMPTS_MAX_AGE, STREAM_REPLICAS, ...; buckets sealed against rollups and purges), and change it: services make what is missing and never change what exists. Builder modules in an older Podium's object stores are copied into the module streams.", streamsApply},
		{operators, "store status", "[--json]", "which ClickHouse replicas answer and how far each is behind",
			"Say which ClickHouse replicas (CLICKHOUSE_ADDR) answer, what each holds and how far it is behind; exit 1 when one does not answer.", storeStatus},
		{operators, "store accept-loss", "[--archive] [--lineage ID --reason TEXT] [--json]", "accept what the ranker's store (or the prompts archive) lost for good, so it refills",
			"Show the evaluations the ranker's store lost for good (its table lost while it held the rows of eras whose EVALUATIONS streams were deleted), which keep the ranker unready and composing nothing; with --lineage (the lost lineage, as shown) and --reason, record the loss and the reason on AUDIT (audit.loss.evaluations), after which the ranker refills its store from the stream there is now. With --archive, the same for the prompt records the prompts archive lost (its table lost while it held the records of deleted PROMPTS streams), which keep the archiver unready and archiving nothing (audit.loss.prompts).", storeAcceptLoss},
		{operators, "store rebuild", "[--from-start] [--batch N] [--show N] [--no-progress]", "write the EVALUATIONS stream into the store again",
			"Write the EVALUATIONS stream into the store again (a dropped table or database, a new database): every evaluation the stream holds, parsed as the ranker parses it, resuming where an interrupted rebuild stopped; then report what the store holds.", storeRebuild},
	}
}

// find returns the command of a name.
func find(cmds []command, name string) (command, bool) {
	i := slices.IndexFunc(cmds, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return cmds[i], true
}

// isGroup reports whether word starts commands of two words (`prompts verify`): its next argument
// names the subcommand.
func isGroup(cmds []command, word string) bool {
	return slices.ContainsFunc(cmds, func(c command) bool { return strings.HasPrefix(c.name, word+" ") })
}

// helpColumn is where the lines of `podium help` say what a command does.
const helpColumn = 36

// helpText is what `podium help` prints: every command of the table, by audience.
// groupHelp lists the commands of a group (podium templates, podium prompts, ...).
func groupHelp(cmds []command, group string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: podium %s COMMAND [flags] [arguments]\n\n", group)
	for _, c := range cmds {
		sub, ok := strings.CutPrefix(c.name, group+" ")
		if !ok {
			continue
		}
		usage := strings.TrimSpace(sub + " " + c.args)
		if len(usage)+2 > helpColumn {
			fmt.Fprintf(&b, "  %s\n  %*s%s\n", usage, helpColumn, "", c.short)
		} else {
			fmt.Fprintf(&b, "  %-*s%s\n", helpColumn, usage, c.short)
		}
	}
	fmt.Fprintf(&b, "\npodium %s COMMAND --help: a command's flags; podium help: every command.\n", group)
	return b.String()
}

func helpText(cmds []command) string {
	var b strings.Builder
	b.WriteString("podium: tools for the people around the pipeline.\n\nUsage: podium COMMAND [flags] [arguments]\n")
	for _, who := range []string{authors, auditors, operators} {
		fmt.Fprintf(&b, "\n%s:\n", who)
		for _, c := range cmds {
			if c.audience != who {
				continue
			}
			// A usage longer than the column puts its line below it.
			usage := strings.TrimSpace(c.name + " " + c.args)
			if len(usage)+2 > helpColumn {
				fmt.Fprintf(&b, "  %s\n  %*s%s\n", usage, helpColumn, "", c.short)
			} else {
				fmt.Fprintf(&b, "  %-*s%s\n", helpColumn, usage, c.short)
			}
		}
	}
	fmt.Fprintf(&b, "\n  %-*s%s\n", helpColumn, "help, COMMAND --help", "this text, or a command's flags")
	fmt.Fprintf(&b, "  %-*s%s\n", helpColumn, "GROUP", "a group's commands (podium templates, podium prompts, ...)")
	fmt.Fprintf(&b, "  %-*s%s\n", helpColumn, "--version", "the version and the commit podium was built from")
	b.WriteString(`
Configuration is the services' environment (NATS_URL, NATS_CREDS, CLICKHOUSE_ADDR,
CLICKHOUSE_DATABASE, ...; PODIUM_ prefixed names override the shared ones). verify also reads the
composer's COMPOSER_TEMPLATES_DIR and TZ, so it loads the templates the composer loaded.

Exit codes: 0 ok; 1 a check failed (a record differs, an event is still invalid); 2 bad arguments or
configuration; 3 NATS or ClickHouse could not be used.`)
	return b.String()
}

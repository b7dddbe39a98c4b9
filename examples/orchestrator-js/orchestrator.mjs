// A tournament played against Podium from Node, as an orchestrator in any language would: it
// publishes evaluation.completed and round.requested events, waits for each answer the way
// docs/contract.md#waiting-for-an-answer says, validates everything it sends and receives with the
// repository's JSON Schemas (ajv), replays an evaluation (which must change nothing), and ends with
// `podium prompts verify --all`.
//
//   NATS_URL=nats://127.0.0.1:4222 PODIUM_BIN=bin/podium node orchestrator.mjs [execution-id]
//
// PODIUM_BIN (optional) is the podium CLI, which verify runs with this process's environment
// (CLICKHOUSE_ADDR, CLICKHOUSE_DATABASE, ...). Exit 0 when every step held, 1 with the reason.
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { connect, headers } from "@nats-io/transport-node";
import { jetstream, DeliverPolicy } from "@nats-io/jetstream";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const TEAMS = [
  { id: "js-alpha", name: "Alpha (JS)" },
  { id: "js-beta", name: "Beta (JS)" },
  { id: "js-gamma", name: "Gamma (JS)" },
];
const ROUNDS = 3;
const execution = process.argv[2] ?? "js-tournament";

// The schemas of the repository, every event checked before it is sent and after it is received.
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
const schema = (type) =>
  ajv.compile(JSON.parse(readFileSync(new URL(`../../schemas/events/${type}.schema.json`, import.meta.url), "utf8")));
const validators = Object.fromEntries(
  ["evaluation.completed", "round.requested", "prompt.composed", "prompt.failed", "leaderboard.updated"].map((t) => [t, schema(t)]),
);
function check(type, event) {
  const validate = validators[type];
  if (!validate(event)) throw new Error(`${type} ${event.id} breaks its schema: ${ajv.errorsText(validate.errors)}`);
}

// A CloudEvent in structured mode; its id is also the Nats-Msg-Id (JetStream drops a repeat).
function cloudEvent(type, id, time, data) {
  return { specversion: "1.0", id, source: "orchestrator/js-example", type, time, datacontenttype: "application/json", data };
}

const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222", name: "js-orchestrator" });
const js = jetstream(nc);

async function publish(subject, event) {
  check(event.type, event);
  const h = headers();
  h.set("Content-Type", "application/cloudevents+json");
  const ack = await js.publish(subject, JSON.stringify(event), { msgID: event.id, headers: h });
  return ack.seq;
}

// Answers: one ordered consumer on PROMPTS for this execution, started before any request is
// published, from the stream's last sequence plus one (not "new": a consumer the client makes
// again before it saw a message would start after what was published meanwhile), so no answer is
// missed; each answer is matched by data.request_id (docs/orchestrators.md).
const answers = new Map(); // request id -> answer event
const waiting = new Map(); // request id -> resolve
const jsm = await js.jetstreamManager();
const promptsInfo = await jsm.streams.info("PROMPTS");
const consumer = await js.consumers.get("PROMPTS", {
  filter_subjects: [`prompt.*.${execution}.*`],
  deliver_policy: DeliverPolicy.StartSequence,
  opt_start_seq: promptsInfo.state.last_seq + 1,
});
const stream = await consumer.consume();
(async () => {
  for await (const m of stream) {
    const event = m.json();
    check(event.type, event);
    answers.set(event.data.request_id, event);
    waiting.get(event.data.request_id)?.(event);
  }
})();
function answerOf(requestId, ms = 30_000) {
  if (answers.has(requestId)) return Promise.resolve(answers.get(requestId));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer to ${requestId} within ${ms} ms`)), ms);
    waiting.set(requestId, (event) => {
      clearTimeout(timer);
      resolve(event);
    });
  });
}

const base = Date.UTC(2026, 10, 25, 9, 0, 0);
const at = (minutes) => new Date(base + minutes * 60_000).toISOString().replace(/\.\d{3}Z$/, "Z");
let published = 0;
let lastSeq = 0; // the EVALUATIONS sequence of the last evaluation's acknowledgement
const firstEvaluation = {};
for (let round = 1; round <= ROUNDS; round++) {
  // Every team's prompt of the round.
  const requests = [];
  for (const team of TEAMS) {
    const id = `req-${execution}-${team.id}-${round}`;
    const event = cloudEvent("round.requested", id, at(round * 60), {
      execution_id: execution, team_id: team.id, team_name: team.name, round_number: round,
      user_prompt: "Name a tool that makes distributed systems boring, and pitch it in one paragraph.",
      max_rounds: ROUNDS, standings: "before_round",
    });
    await publish(`round.requested.${execution}.${team.id}`, event);
    requests.push({ id, team, round });
  }
  for (const r of requests) {
    const answer = await answerOf(r.id);
    if (answer.type !== "prompt.composed") throw new Error(`${r.id}: ${answer.type} ${JSON.stringify(answer.data)}`);
    const d = answer.data;
    if (d.team_id !== r.team.id || d.round_number !== r.round) throw new Error(`${r.id}: the answer is of ${d.team_id} round ${d.round_number}`);
    // Round 1 has no history; later rounds carry the team's earlier rounds and a leaderboard.
    if (d.inputs.history_rounds.length !== r.round - 1) {
      throw new Error(`${r.id}: history rounds ${JSON.stringify(d.inputs.history_rounds)}, want ${r.round - 1}`);
    }
    if (r.round > 1 && d.inputs.leaderboard.length !== TEAMS.length) throw new Error(`${r.id}: leaderboard of ${d.inputs.leaderboard.length} teams`);
    console.log(`round ${r.round} ${r.team.id}: prompt of ${d.token_estimate} tokens, sha256 ${d.prompt_sha256.slice(0, 12)}…, as of sequence ${d.inputs.evaluations_seq}`);
  }
  // The evaluator scores every team's submission.
  for (const [i, team] of TEAMS.entries()) {
    const id = `eval-${execution}-${team.id}-${round}`;
    const event = cloudEvent("evaluation.completed", id, at(round * 60 + 30), {
      execution_id: execution, team_id: team.id, team_name: team.name, round_number: round,
      submission: { content: `${team.name}, round ${round}: Steady <turns incidents & pages> into nothing to watch.`, format: "md" },
      evaluation: { overall_score: 60 + 7 * i + 5 * round, feedback: `Round ${round}: sharper first sentence.`,
        metrics: [{ metric_name: "Clarity", score: 55 + 5 * round, evaluator_comment: "readable" }] },
      evaluated_at: at(round * 60 + 30),
    });
    lastSeq = Math.max(lastSeq, await publish(`evaluation.completed.${execution}.${team.id}`, event));
    published++;
    if (round === 1 && i === 0) firstEvaluation.event = event;
  }
}

// A replay of the first evaluation, under a new message id and with another score: the same event
// id changes nothing.
const replay = { ...firstEvaluation.event, data: { ...firstEvaluation.event.data, evaluation: { ...firstEvaluation.event.data.evaluation, overall_score: 1000 } } };
check("evaluation.completed", replay);
{
  const h = headers();
  h.set("Content-Type", "application/cloudevents+json");
  const ack = await js.publish(`evaluation.completed.${execution}.${TEAMS[0].id}`, JSON.stringify(replay), { msgID: `${replay.id}-replayed`, headers: h });
  lastSeq = Math.max(lastSeq, ack.seq);
}

// The final board, as of the last evaluation's sequence: the ranker answers once it has committed
// everything up to it, the replay included (docs/orchestrators.md, "Read the board as of your
// evaluations").
const rankerURL = process.env.RANKER_URL ?? "http://127.0.0.1:8082";
let board;
for (let attempt = 1; ; attempt++) {
  const res = await fetch(`${rankerURL}/v1/executions/${execution}/leaderboard?as_of=${lastSeq}&wait=10s`);
  const body = await res.json();
  if (res.ok) { board = body.teams; break; }
  if (res.status !== 503 || attempt === 10) throw new Error(`the board as of ${lastSeq}: ${res.status} ${JSON.stringify(body)}`);
  await new Promise((r) => setTimeout(r, 1000));
}
const counted = board.reduce((n, row) => n + row.rounds, 0);
if (counted !== published) throw new Error(`the board counts ${counted} evaluations, ${published} were published`);
if (board.some((row) => row.best_score === 1000)) throw new Error("the replayed evaluation was counted");
console.log("final board:", board.map((r) => `${r.position}. ${r.team_id} ${r.best_score} (rank ${r.rank})`).join(", "));

await stream.close();
await nc.drain();

// The auditor's check: every prompt is what its request renders again.
if (process.env.PODIUM_BIN) {
  const out = execFileSync(process.env.PODIUM_BIN, ["prompts", "verify", "--all", "--execution", execution], { encoding: "utf8" });
  process.stdout.write(out);
}
console.log(`ok: ${ROUNDS} rounds of ${TEAMS.length} teams, every event valid by the schemas, the replay changed nothing`);

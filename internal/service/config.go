package service

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Common is the configuration both services read. Each variable may be prefixed with the service
// name (COMPOSER_NATS_URL) to override the shared one (NATS_URL).
type Common struct {
	NATSURL      string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222" desc:"comma-separated NATS server URLs"`
	NATSCreds    string `envconfig:"NATS_CREDS" desc:"NATS credentials file (JWT + nkey)"`
	NATSUser     string `envconfig:"NATS_USER" desc:"NATS user"`
	NATSPassword string `envconfig:"NATS_PASSWORD" desc:"NATS password"`
	NATSTLSCA    string `envconfig:"NATS_TLS_CA" desc:"CA certificate file for NATS TLS"`

	ClickHouseAddr     []string `envconfig:"CLICKHOUSE_ADDR" default:"127.0.0.1:9000" desc:"ClickHouse native-protocol host:port list, comma-separated"`
	ClickHouseDatabase string   `envconfig:"CLICKHOUSE_DATABASE" default:"rounds" desc:"ClickHouse database (created by the ranker if missing)"`
	ClickHouseUser     string   `envconfig:"CLICKHOUSE_USER" default:"default" desc:"ClickHouse user"`
	ClickHousePassword string   `envconfig:"CLICKHOUSE_PASSWORD" desc:"ClickHouse password"`
	// 1 from BenchmarkScoresReadThreads: 16 readers at once did 1.4x the reads/s of the server's
	// default (2 on 2 cores) at 0.67x its CPU per read, and 2x those of 16 threads.
	ClickHouseReadThreads int `envconfig:"CLICKHOUSE_READ_THREADS" default:"1" desc:"ClickHouse max_threads of the reads of one execution's rows (scores, content, history); 0 = the server's default, one per core"`

	ClickHouseReplicated          bool          `envconfig:"CLICKHOUSE_REPLICATED" default:"false" desc:"CLICKHOUSE_ADDR lists every replica of one shard: replicated tables, quorum writes, quorum reads"`
	ClickHouseCluster             string        `envconfig:"CLICKHOUSE_CLUSTER" desc:"with CLICKHOUSE_REPLICATED: run the migrations ON CLUSTER of this remote_servers name instead of on each address"`
	ClickHouseZooKeeperPath       string        `envconfig:"CLICKHOUSE_ZOOKEEPER_PATH" default:"/clickhouse/tables/{shard}" desc:"ZooKeeper path prefix of replicated tables (database and table names are appended; macros are the servers')"`
	ClickHouseReplicaName         string        `envconfig:"CLICKHOUSE_REPLICA_NAME" default:"{replica}" desc:"replica name of replicated tables, normally the servers' {replica} macro"`
	ClickHouseInsertQuorum        int           `envconfig:"CLICKHOUSE_INSERT_QUORUM" default:"0" desc:"replicas that must have an evaluation before the ranker acks it; 0 = a majority of CLICKHOUSE_ADDR"`
	ClickHouseInsertQuorumTimeout time.Duration `envconfig:"CLICKHOUSE_INSERT_QUORUM_TIMEOUT" default:"10s" desc:"longest wait for the quorum of one insert; the ranker then retries it (writes are idempotent)"`

	ManageStreams  bool `envconfig:"MANAGE_STREAMS" default:"true" desc:"create or update the streams at start (false where an operator owns them)"`
	StreamReplicas int  `envconfig:"STREAM_REPLICAS" default:"1" desc:"JetStream replicas of every stream (3 in a cluster)"`
	// Retention: unset leaves what the stream has on the server (an operator's own edit stands;
	// a new stream keeps everything); set, the services apply it at every start.
	PromptsMaxAge       *time.Duration `envconfig:"PROMPTS_MAX_AGE" desc:"retention of the PROMPTS audit stream (0 = for ever, else at least 1h, above the archive's worst lag); unset: what the stream has is left alone"`
	PromptsMaxBytes     *int64         `envconfig:"PROMPTS_MAX_BYTES" desc:"bytes PROMPTS keeps at most, the oldest records removed first (0 = no bound, else at least 64 MiB); unset: left alone"`
	EvaluationsMaxAge   *time.Duration `envconfig:"EVALUATIONS_MAX_AGE" desc:"retention of EVALUATIONS (0 = for ever, else at least 1h); a store refilled after a trim holds what the stream kept; unset: left alone"`
	EvaluationsMaxBytes *int64         `envconfig:"EVALUATIONS_MAX_BYTES" desc:"bytes EVALUATIONS keeps at most (0 = no bound, else at least 64 MiB); unset: left alone"`
	StateMaxIdle        time.Duration  `envconfig:"STATE_MAX_IDLE" default:"168h" desc:"how long an execution's score snapshot (SCORES) and last leaderboard.updated (LEADERBOARDS) stay after its last commit; readers then use ClickHouse; 0 = for ever"`
	MaxEventBytes       int            `envconfig:"MAX_EVENT_BYTES" default:"1048576" desc:"largest accepted event body in bytes"`
	LogLevel            LogLevel       `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error; logs are JSON on stderr"`
	Pprof               bool           `envconfig:"PPROF" default:"false" desc:"serve Go profiles under /debug/pprof/ on the HTTP address (off: they expose internals)"`

	HTTPReadTimeout  time.Duration `envconfig:"HTTP_READ_TIMEOUT" default:"15s" desc:"longest time to read one HTTP request, body included (slow clients are cut off)"`
	HTTPWriteTimeout time.Duration `envconfig:"HTTP_WRITE_TIMEOUT" default:"60s" desc:"longest time to answer one HTTP request (a render waits for inputs, then renders)"`
	HTTPIdleTimeout  time.Duration `envconfig:"HTTP_IDLE_TIMEOUT" default:"60s" desc:"how long an idle keep-alive HTTP connection stays open"`
}

// HTTPLimits are the bounds every HTTP server of a service applies.
func (c *Common) HTTPLimits() HTTPLimits {
	return HTTPLimits{Read: c.HTTPReadTimeout, Write: c.HTTPWriteTimeout, Idle: c.HTTPIdleTimeout}
}

// Shared returns the shared part of a service's configuration.
func (c *Common) Shared() *Common { return c }

// ValidateShared checks ranges of the shared settings that types alone do not; prefix is the
// service's (COMPOSER) for the messages.
func (c *Common) ValidateShared(prefix string) error {
	var errs []error
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		errs = append(errs, fmt.Errorf("STREAM_REPLICAS (or %s_STREAM_REPLICAS) must be 1 to 5, got %d", prefix, c.StreamReplicas))
	}
	if c.MaxEventBytes < 1 {
		errs = append(errs, fmt.Errorf("MAX_EVENT_BYTES (or %s_MAX_EVENT_BYTES) must be positive, got %d", prefix, c.MaxEventBytes))
	}
	for name, d := range map[string]*time.Duration{"PROMPTS_MAX_AGE": c.PromptsMaxAge, "EVALUATIONS_MAX_AGE": c.EvaluationsMaxAge} {
		if d != nil && *d != 0 && *d < minRetention {
			errs = append(errs, fmt.Errorf("%s (or %s_%s) must be 0 (for ever) or at least %s, got %s: a shorter retention trims records before the archive or the store can be refilled from them", name, prefix, name, minRetention, *d))
		}
	}
	for name, b := range map[string]*int64{"PROMPTS_MAX_BYTES": c.PromptsMaxBytes, "EVALUATIONS_MAX_BYTES": c.EvaluationsMaxBytes} {
		if b != nil && *b != 0 && *b != -1 && *b < minRetentionBytes {
			errs = append(errs, fmt.Errorf("%s (or %s_%s) must be 0 (no bound) or at least %d (64 MiB), got %d", name, prefix, name, minRetentionBytes, *b))
		}
	}
	if c.StateMaxIdle < 0 {
		errs = append(errs, fmt.Errorf("STATE_MAX_IDLE (or %s_STATE_MAX_IDLE) must be 0 (for ever) or positive, got %s", prefix, c.StateMaxIdle))
	}
	if len(c.ClickHouseAddr) == 0 {
		errs = append(errs, fmt.Errorf("CLICKHOUSE_ADDR (or %s_CLICKHOUSE_ADDR) must name at least one host:port", prefix))
	}
	for _, a := range c.ClickHouseAddr {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("CLICKHOUSE_ADDR (or %s_CLICKHOUSE_ADDR): %q is not host:port", prefix, a))
		}
	}
	if c.ClickHouseReadThreads < 0 {
		errs = append(errs, fmt.Errorf("CLICKHOUSE_READ_THREADS (or %s_CLICKHOUSE_READ_THREADS) must be 0 (the server's default) or more, got %d", prefix, c.ClickHouseReadThreads))
	}
	errs = append(errs, c.validateReplication(prefix)...)
	if err := checkNATSURLs(c.NATSURL); err != nil {
		errs = append(errs, fmt.Errorf("NATS_URL (or %s_NATS_URL): %w", prefix, err))
	}
	for name, d := range map[string]time.Duration{"HTTP_READ_TIMEOUT": c.HTTPReadTimeout, "HTTP_WRITE_TIMEOUT": c.HTTPWriteTimeout, "HTTP_IDLE_TIMEOUT": c.HTTPIdleTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s (or %s_%s) must be positive, got %s", name, prefix, name, d))
		}
	}
	return errors.Join(errs...)
}

func (c *Common) validateReplication(prefix string) []error {
	var errs []error
	if !c.ClickHouseReplicated {
		if c.ClickHouseCluster != "" {
			errs = append(errs, fmt.Errorf("CLICKHOUSE_CLUSTER (or %s_CLICKHOUSE_CLUSTER) needs CLICKHOUSE_REPLICATED=true", prefix))
		}
		return errs
	}
	if q := c.ClickHouseInsertQuorum; q < 0 || q > len(c.ClickHouseAddr) {
		errs = append(errs, fmt.Errorf("CLICKHOUSE_INSERT_QUORUM (or %s_CLICKHOUSE_INSERT_QUORUM) must be 0 (a majority) to the %d replicas of CLICKHOUSE_ADDR, got %d", prefix, len(c.ClickHouseAddr), q))
	}
	if c.ClickHouseInsertQuorumTimeout < time.Second {
		errs = append(errs, fmt.Errorf("CLICKHOUSE_INSERT_QUORUM_TIMEOUT (or %s_CLICKHOUSE_INSERT_QUORUM_TIMEOUT) must be at least 1s, got %s", prefix, c.ClickHouseInsertQuorumTimeout))
	}
	if !strings.HasPrefix(c.ClickHouseZooKeeperPath, "/") {
		errs = append(errs, fmt.Errorf("CLICKHOUSE_ZOOKEEPER_PATH (or %s_CLICKHOUSE_ZOOKEEPER_PATH) must be an absolute ZooKeeper path, got %q", prefix, c.ClickHouseZooKeeperPath))
	}
	if c.ClickHouseReplicaName == "" {
		errs = append(errs, fmt.Errorf("CLICKHOUSE_REPLICA_NAME (or %s_CLICKHOUSE_REPLICA_NAME) must not be empty", prefix))
	}
	return errs
}

// The least retention a stream may be given: PROMPTS must keep a record until the archive has it,
// and EVALUATIONS until the store does (both are seconds behind when healthy; the alert on the
// archive's lag fires at five minutes).
const (
	minRetention      = time.Hour
	minRetentionBytes = 64 << 20
)

// Streams returns the stream options the configuration asks for.
func (c *Common) Streams() events.StreamOptions {
	return events.StreamOptions{Replicas: c.StreamReplicas, StateMaxIdle: c.StateMaxIdle,
		Prompts:     events.Retention{MaxAge: c.PromptsMaxAge, MaxBytes: c.PromptsMaxBytes},
		Evaluations: events.Retention{MaxAge: c.EvaluationsMaxAge, MaxBytes: c.EvaluationsMaxBytes}}
}

// Store returns where ClickHouse is and how it replicates; log hears of replicas failing over.
func (c *Common) Store(log *slog.Logger) rank.Config {
	return rank.Config{
		Addrs: c.ClickHouseAddr, Database: c.ClickHouseDatabase, User: c.ClickHouseUser, Password: c.ClickHousePassword,
		ReadThreads: c.ClickHouseReadThreads,
		Replication: rank.Replication{
			Enabled:             c.ClickHouseReplicated,
			Cluster:             c.ClickHouseCluster,
			ZooKeeperPath:       c.ClickHouseZooKeeperPath,
			ReplicaName:         c.ClickHouseReplicaName,
			InsertQuorum:        c.ClickHouseInsertQuorum,
			InsertQuorumTimeout: c.ClickHouseInsertQuorumTimeout,
		},
		Log: log,
	}
}

// LogLevel is a slog level read from the environment by name.
type LogLevel slog.Level

// Decode implements envconfig.Decoder.
func (l *LogLevel) Decode(v string) error {
	switch strings.ToLower(v) {
	case "debug":
		*l = LogLevel(slog.LevelDebug)
	case "info":
		*l = LogLevel(slog.LevelInfo)
	case "warn", "warning":
		*l = LogLevel(slog.LevelWarn)
	case "error":
		*l = LogLevel(slog.LevelError)
	default:
		return fmt.Errorf("%q is not one of debug, info, warn, error", v)
	}
	return nil
}

// Load reads cfg from the environment with envconfig under prefix ("ranker", "composer").
func Load(prefix string, cfg any) error {
	if err := envconfig.Process(prefix, cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	return nil
}

// Usage writes the --help text: what the command does and the variable table. Shared settings
// are listed by their shared name (NATS_URL), a service's own by its prefixed one
// (RANKER_BATCH_SIZE), as the README names them.
func Usage(w io.Writer, prefix, summary string, cfg any) error {
	fmt.Fprintf(w, "%s\n\nConfiguration is read from the environment. Every variable may also be given with the\nprefix %s_ (for example %s_NATS_URL), which overrides the shared name.\n\n",
		summary, strings.ToUpper(prefix), strings.ToUpper(prefix))
	shared := map[string]bool{}
	t := reflect.TypeFor[Common]()
	for i := range t.NumField() {
		shared[t.Field(i).Tag.Get("envconfig")] = true
	}
	tmpl := template.Must(template.New("usage").Funcs(template.FuncMap{
		"name": func(key, alt string) string {
			if shared[alt] {
				return alt
			}
			return key
		},
	}).Parse(usageFormat))
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	if err := envconfig.Usaget(prefix, cfg, tw, tmpl); err != nil {
		return err
	}
	return tw.Flush()
}

const usageFormat = `VARIABLE	DEFAULT	MEANING
{{range .}}{{name .Key .Alt}}	{{.Tags.Get "default"}}	{{.Tags.Get "desc"}}
{{end}}`

// NewLogger returns the JSON logger every line of a service goes through.
// Lines logged with a context inside a span carry its trace_id and span_id.
func NewLogger(w io.Writer, level LogLevel, serviceName string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(level)})
	return slog.New(tracing.LogHandler(h)).With("service", serviceName)
}

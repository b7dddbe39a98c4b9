// Package servers starts the real servers the pipeline needs on this machine: an in-process
// JetStream server, a private clickhouse-server process with its own ports and data, and a
// replicated ClickHouse cluster (one ZooKeeper, N replicas of one shard) for tests of replica
// loss. Tests, benchmarks and the demo use it; production deployments never do.
package servers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// StartNATS runs a JetStream-enabled NATS server in this process on a free loopback port, storing
// streams under storeDir; each of tune may change its options (a storage limit). Stop it with
// Shutdown and WaitForShutdown.
func StartNATS(storeDir string, tune ...func(*server.Options)) (*server.Server, error) {
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
	}
	for _, t := range tune {
		t(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("servers: nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("servers: nats did not accept connections within 10s")
	}
	return s, nil
}

// ClickHouse is a private clickhouse-server process.
type ClickHouse struct {
	Addr string // host:port of the native protocol
	Dir  string // config, data and logs
	bin  string
	args []string
	// zookeeper marks a cluster replica: it is ready only once its ZooKeeper session works, or
	// the first replicated DDL after a start would fail.
	zookeeper bool
	proc      *process // the current run; nil before the first
}

// ErrNoClickHouse says the server binary is missing and how to get it.
var ErrNoClickHouse = errors.New("clickhouse-server is not installed: run `apt-get install -y clickhouse-server clickhouse-client` (Debian's package)")

// StartClickHouse starts clickhouse-server with a config of its own under dir (free loopback
// ports, data and logs in dir) and waits until it answers queries. The process is killed if this
// process dies, so an aborted test run leaves nothing behind.
func StartClickHouse(ctx context.Context, dir string) (*ClickHouse, error) {
	return StartClickHouseWith(ctx, dir, "")
}

// StartClickHouseWith is StartClickHouse with extra XML in the server's config (a compression
// method, to measure the archive under it).
func StartClickHouseWith(ctx context.Context, dir, extra string) (*ClickHouse, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	ch, err := newClickHouse(dir, ports[0], ports[1], extra)
	if err != nil {
		return nil, err
	}
	if err := ch.Start(ctx); err != nil {
		return nil, err
	}
	return ch, nil
}

// newClickHouse writes the config of a server on the given ports into dir, with extra XML
// (cluster settings) inside the root element, and returns it not yet running.
func newClickHouse(dir string, tcpPort, httpPort int, extra string) (*ClickHouse, error) {
	bin, args, err := clickhouseCommand()
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("servers: clickhouse: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(clickhouseConfig(dir, tcpPort, httpPort, extra)), 0o644); err != nil {
		return nil, fmt.Errorf("servers: clickhouse: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(clickhouseUsers()), 0o644); err != nil {
		return nil, fmt.Errorf("servers: clickhouse: %w", err)
	}
	args = append(args, "--config-file="+filepath.Join(dir, "config.xml"))
	return &ClickHouse{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(tcpPort)), Dir: dir, bin: bin, args: args}, nil
}

// Start launches the server with its config, data and ports (again, after Stop or Kill) and waits
// until it answers queries; a cluster replica also waits for its ZooKeeper session.
func (c *ClickHouse) Start(ctx context.Context) error {
	if c.proc != nil && !c.proc.exited() {
		return fmt.Errorf("servers: clickhouse-server at %s is already running", c.Addr)
	}
	p, err := launch{name: "clickhouse-server", addr: c.Addr, dir: c.Dir, out: "stdout.log", log: "clickhouse-server.err.log",
		bin: c.bin, args: c.args, ready: c.ready}.start(ctx)
	c.proc = p
	return err
}

// Restart stops the server and starts it again on the same port with the same data, as an
// operator's restart or a crash-and-recover would.
func (c *ClickHouse) Restart(ctx context.Context) error {
	c.Stop()
	return c.Start(ctx)
}

func clickhouseCommand() (string, []string, error) {
	if p, err := exec.LookPath("clickhouse-server"); err == nil {
		return p, nil, nil
	}
	if p, err := exec.LookPath("clickhouse"); err == nil {
		return p, []string{"server"}, nil
	}
	return "", nil, ErrNoClickHouse
}

// ready says whether the server answers queries and, a cluster replica, has its ZooKeeper session.
func (c *ClickHouse) ready(ctx context.Context) error {
	if err := c.Ping(ctx); err != nil || !c.zookeeper {
		return err
	}
	return c.pingZooKeeper(ctx)
}

// launch is how a server process starts: its name and address for the messages, the folder it
// runs in, the file its output goes to and the log a failed start names, and ready, which
// answers nil once it serves.
type launch struct {
	name, addr, dir, out, log, bin string
	args                           []string
	ready                          func(context.Context) error
}

// start starts the process and waits until it serves (a minute at most); one that does not is
// stopped, and returned with the error so that its owner can still look at it.
func (l launch) start(ctx context.Context) (*process, error) {
	p, err := startProcess(l.dir, l.out, l.bin, l.args)
	if err != nil {
		return nil, fmt.Errorf("servers: %s: %w", l.name, err)
	}
	if err := p.waitReady(ctx, 60*time.Second, l.name, l.addr, filepath.Join(l.dir, l.log), l.ready); err != nil {
		p.stop(10 * time.Second)
		return p, err
	}
	return p, nil
}

// waitReady polls ready every 100 ms until it answers nil, the process exits (its log named), or
// limit passes.
func (p *process) waitReady(ctx context.Context, limit time.Duration, name, addr, log string, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		wait, stop := context.WithTimeout(ctx, 100*time.Millisecond)
		select {
		case <-p.done:
			stop()
			return fmt.Errorf("servers: %s exited at start (%v); see %s", name, p.err, log)
		case <-wait.Done():
			stop()
		}
		if ctx.Err() != nil {
			return fmt.Errorf("servers: %s at %s not ready after %s: %v", name, addr, limit, last)
		}
		if last = ready(ctx); last == nil {
			return nil
		}
	}
}

// Ping opens a short connection and runs SELECT 1.
func (c *ClickHouse) Ping(ctx context.Context) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr}, DialTimeout: time.Second})
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Ping(ctx)
}

// pingZooKeeper reads the ZooKeeper root through the server, which works only once the server's
// ZooKeeper session is up.
func (c *ClickHouse) pingZooKeeper(ctx context.Context) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr}, DialTimeout: time.Second})
	if err != nil {
		return err
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&n); err != nil {
		return fmt.Errorf("zookeeper session: %w", err)
	}
	return nil
}

// Pause freezes the server (SIGSTOP), as a hung or overloaded ClickHouse would look to clients.
func (c *ClickHouse) Pause() error { return c.proc.cmd.Process.Signal(syscall.SIGSTOP) }

// Pid is the server's process id, for reading its resource use.
func (c *ClickHouse) Pid() int { return c.proc.cmd.Process.Pid }

// Resume undoes Pause.
func (c *ClickHouse) Resume() error { return c.proc.cmd.Process.Signal(syscall.SIGCONT) }

// Stop terminates the server, killing it if it does not exit within 10 seconds. Stopping a
// server that is not running does nothing.
func (c *ClickHouse) Stop() error {
	c.proc.stop(10 * time.Second)
	return nil
}

// Kill ends the server with SIGKILL and waits for it to exit, as a crash would: no shutdown, so
// its ZooKeeper session stays open until it times out. Start brings it back on the same data.
func (c *ClickHouse) Kill() error {
	if c.proc == nil {
		return nil
	}
	if err := c.proc.kill(); err != nil {
		return fmt.Errorf("servers: kill clickhouse-server at %s: %w", c.Addr, err)
	}
	return nil
}

// Logs returns the tail of the server's error log, for failure messages.
func (c *ClickHouse) Logs() string {
	return tail(filepath.Join(c.Dir, "clickhouse-server.err.log"))
}

// tail is the end of a log file, at most 4 KiB.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	return string(b[max(0, len(b)-4096):])
}

// Servers' ports come from 30000-32767, below the kernel's ephemeral range (32768 and up): a
// port found free there cannot be taken by some process's outgoing connection before the server
// binds it, nor while a killed server is down before it starts again on the same port (which
// failed TestClusterSurvivesReplicaLoss with exit 70 under a full parallel test run). e2e hands
// out its services' ports from 20000-29999 for the same reason.
const (
	portsFrom  = 30000
	portsCount = 2768
)

// freePorts finds n distinct free loopback ports in that range. It holds them all open until it
// has them all, so a cluster's servers never get the same port twice; it starts at a random place,
// so packages tested at once rarely look at the same ports.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	start := rand.IntN(portsCount)
	for i := 0; i < portsCount && len(ports) < n; i++ {
		port := portsFrom + (start+i)%portsCount
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken: try the next
		}
		defer l.Close()
		ports = append(ports, port)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("servers: no %d free ports in %d-%d", n, portsFrom, portsFrom+portsCount-1)
	}
	return ports, nil
}

// process is one run of a server binary, its output appended to a log in its directory.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and err is set
	err  error         // what Wait returned
}

// startProcess starts bin in dir. The child gets SIGKILL if this process dies (Pdeathsig), so an
// aborted test run leaves no server behind.
func startProcess(dir, logName, bin string, args []string) (*process, error) {
	out, err := os.OpenFile(filepath.Join(dir, logName), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to exit (SIGTERM) and kills it after grace.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot act on SIGTERM
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *process) kill() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-p.done
	return nil
}

// clickhouseConfig is a minimal server config that 18.16 and current releases both read; the
// <yandex> root is the one 18.16 knows and newer servers still accept. extra goes inside the root
// as it is.
func clickhouseConfig(dir string, tcpPort, httpPort int, extra string) string {
	return fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
  <logger>
    <level>warning</level>
    <log>%[1]s/clickhouse-server.log</log>
    <errorlog>%[1]s/clickhouse-server.err.log</errorlog>
    <size>10M</size>
    <count>2</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>%[2]d</tcp_port>
  <http_port>%[3]d</http_port>
  <path>%[1]s/data/</path>
  <tmp_path>%[1]s/tmp/</tmp_path>
  <user_files_path>%[1]s/user_files/</user_files_path>
  <format_schema_path>%[1]s/format_schemas/</format_schema_path>
  <users_config>%[1]s/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <max_concurrent_queries>200</max_concurrent_queries>
  <mark_cache_size>268435456</mark_cache_size>
  <uncompressed_cache_size>268435456</uncompressed_cache_size>
  <mlock_executable>false</mlock_executable>
%[4]s</yandex>
`, dir, tcpPort, httpPort, extra)
}

// clickhouseUsers is the stock "default" user without password, reachable from loopback, and
// "reader", who may only read (readonly=1: no writes, no DDL, no settings changed), as an operator
// gives the web console.
func clickhouseUsers() string {
	return `<?xml version="1.0"?>
<yandex>
  <profiles>
    <default>
      <max_memory_usage>4000000000</max_memory_usage>
      <load_balancing>random</load_balancing>
    </default>
    <readonly>
      <max_memory_usage>4000000000</max_memory_usage>
      <readonly>1</readonly>
    </readonly>
  </profiles>
  <users>
` + loopbackUser("default", "default") + loopbackUser("reader", "readonly") + `  </users>
  <quotas>
    <default>
      <interval>
        <duration>3600</duration>
        <queries>0</queries>
        <errors>0</errors>
        <result_rows>0</result_rows>
        <read_rows>0</read_rows>
        <execution_time>0</execution_time>
      </interval>
    </default>
  </quotas>
</yandex>
`
}

// StartNATSCluster starts n JetStream servers clustered with each other (each with its store
// under dir), so streams may have n replicas; it returns once a meta leader is elected.
func StartNATSCluster(dir string, n int) ([]*server.Server, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i])
	}
	var out []*server.Server
	stop := func() {
		for _, s := range out {
			s.Shutdown()
		}
	}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "podium", Host: "127.0.0.1", Port: ports[n+i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			stop()
			return nil, fmt.Errorf("servers: nats n%d: %w", i+1, err)
		}
		go s.Start()
		out = append(out, s)
	}
	for _, s := range out {
		if !s.ReadyForConnections(10 * time.Second) {
			stop()
			return nil, errors.New("servers: a clustered nats did not accept connections within 10s")
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		for _, s := range out {
			if s.JetStreamIsLeader() {
				return out, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("servers: the nats cluster elected no JetStream meta leader within 20s")
		}
	}
}

// loopbackUser is a ClickHouse user without password, reachable from loopback, of a profile.
func loopbackUser(name, profile string) string {
	return fmt.Sprintf(`    <%[1]s>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>%[2]s</profile>
      <quota>default</quota>
    </%[1]s>
`, name, profile)
}

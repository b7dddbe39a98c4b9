// Package servers starts the real servers the pipeline needs on this machine: an in-process
// JetStream server and a private clickhouse-server process with its own ports and data. Tests,
// benchmarks and the demo use it; production deployments never do.
package servers

import (
	"context"
	"errors"
	"fmt"

	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// StartNATS runs a JetStream-enabled NATS server in this process on a free loopback port, storing
// streams under storeDir. Stop it with Shutdown and WaitForShutdown.
func StartNATS(storeDir string) (*server.Server, error) {
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
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
	cmd  *exec.Cmd
	done chan error
}

// ErrNoClickHouse says the server binary is missing and how to get it.
var ErrNoClickHouse = errors.New("clickhouse-server is not installed: run `apt-get install -y clickhouse-server clickhouse-client` (Debian's package)")

// StartClickHouse starts clickhouse-server with a config of its own under dir (free loopback
// ports, data and logs in dir) and waits until it answers queries. The process is killed if this
// process dies, so an aborted test run leaves nothing behind.
func StartClickHouse(ctx context.Context, dir string) (*ClickHouse, error) {
	bin, args, err := clickhouseCommand()
	if err != nil {
		return nil, err
	}
	tcpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("servers: clickhouse: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(clickhouseConfig(dir, tcpPort, httpPort)), 0o644); err != nil {
		return nil, fmt.Errorf("servers: clickhouse: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(clickhouseUsers), 0o644); err != nil {
		return nil, fmt.Errorf("servers: clickhouse: %w", err)
	}
	args = append(args, "--config-file="+filepath.Join(dir, "config.xml"))
	ch := &ClickHouse{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(tcpPort)), Dir: dir, bin: bin, args: args}
	if err := ch.launch(ctx); err != nil {
		return nil, err
	}
	return ch, nil
}

// launch starts the process and waits until it answers.
func (c *ClickHouse) launch(ctx context.Context) error {
	out, err := os.OpenFile(filepath.Join(c.Dir, "stdout.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("servers: clickhouse: %w", err)
	}
	cmd := exec.Command(c.bin, c.args...)
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("servers: start %s: %w", c.bin, err)
	}
	c.cmd, c.done = cmd, make(chan error, 1)
	go func() { c.done <- cmd.Wait(); out.Close() }()
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		c.Stop()
		return err
	}
	return nil
}

// Restart stops the server and starts it again on the same port with the same data, as an
// operator's restart or a crash-and-recover would.
func (c *ClickHouse) Restart(ctx context.Context) error {
	c.Stop()
	return c.launch(ctx)
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

func (c *ClickHouse) waitReady(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		select {
		case err := <-c.done:
			c.done <- err
			return fmt.Errorf("servers: clickhouse-server exited at start (%v); see %s", err, filepath.Join(c.Dir, "clickhouse-server.err.log"))
		case <-ctx.Done():
			return fmt.Errorf("servers: clickhouse-server at %s not ready after %s: %v", c.Addr, limit, last)
		case <-time.After(100 * time.Millisecond):
		}
		if last = c.Ping(ctx); last == nil {
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

// Pause freezes the server (SIGSTOP), as a hung or overloaded ClickHouse would look to clients.
func (c *ClickHouse) Pause() error { return c.cmd.Process.Signal(syscall.SIGSTOP) }

// Pid is the server's process id, for reading its resource use.
func (c *ClickHouse) Pid() int { return c.cmd.Process.Pid }

// Resume undoes Pause.
func (c *ClickHouse) Resume() error { return c.cmd.Process.Signal(syscall.SIGCONT) }

// Stop terminates the server, killing it if it does not exit within 10 seconds.
func (c *ClickHouse) Stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot act on SIGTERM
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return nil
}

// Logs returns the tail of the server's error log, for failure messages.
func (c *ClickHouse) Logs() string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "clickhouse-server.err.log"))
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("servers: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// clickhouseConfig is a minimal server config that 18.16 and current releases both read; the
// <yandex> root is the one 18.16 knows and newer servers still accept.
func clickhouseConfig(dir string, tcpPort, httpPort int) string {
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
</yandex>
`, dir, tcpPort, httpPort)
}

// clickhouseUsers is the stock single "default" user without password, reachable from loopback.
const clickhouseUsers = `<?xml version="1.0"?>
<yandex>
  <profiles>
    <default>
      <max_memory_usage>4000000000</max_memory_usage>
      <load_balancing>random</load_balancing>
    </default>
  </profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
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

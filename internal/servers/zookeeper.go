package servers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ZooKeeper is a private standalone ZooKeeper server process (Debian's `zookeeper` package, run
// in the foreground), the coordinator replicated ClickHouse tables need.
type ZooKeeper struct {
	Addr string // host:port of the client port
	Dir  string // zoo.cfg, data and zookeeper.log
	java string
	args []string
	proc *process
}

// zookeeperJar is where Debian's package puts the server; its manifest names the jars it needs
// but no logging backend, so the command line adds slf4j-simple beside it.
const zookeeperJar = "/usr/share/java/zookeeper.jar"

// ErrNoZooKeeper says java or the ZooKeeper jar is missing and how to get them.
var ErrNoZooKeeper = errors.New("zookeeper is not installed: run `apt-get install -y zookeeper` (Debian's package, which brings java)")

// StartZooKeeper starts a standalone ZooKeeper on a free loopback port with its data and log
// under dir, and waits until it serves clients. Like ClickHouse, it is killed if this process
// dies.
func StartZooKeeper(ctx context.Context, dir string) (*ZooKeeper, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	return startZooKeeper(ctx, dir, ports[0])
}

func startZooKeeper(ctx context.Context, dir string, port int) (*ZooKeeper, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, ErrNoZooKeeper
	}
	if _, err := os.Stat(zookeeperJar); err != nil {
		return nil, ErrNoZooKeeper
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("servers: zookeeper: %w", err)
	}
	// A short tick lets ClickHouse ask for short sessions (the minimum is two ticks), so a killed
	// replica's session, and its claim to be active, expires in seconds. The admin server would
	// take port 8080; only the four-letter commands needed to check health are allowed.
	cfg := fmt.Sprintf(`tickTime=500
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,mntr
`, filepath.Join(dir, "data"), port)
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("servers: zookeeper: %w", err)
	}
	z := &ZooKeeper{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Dir:  dir,
		java: java,
		args: []string{
			"-Xmx256m",
			"-cp", zookeeperJar + ":/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar",
			"org.apache.zookeeper.server.quorum.QuorumPeerMain",
			filepath.Join(dir, "zoo.cfg"),
		},
	}
	if err := z.start(ctx); err != nil {
		return nil, err
	}
	return z, nil
}

func (z *ZooKeeper) start(ctx context.Context) error {
	// Ready once srvr reports a mode: ruok answers imok while the server is still loading its
	// database and refusing sessions.
	p, err := launch{name: "zookeeper", addr: z.Addr, dir: z.Dir, out: "zookeeper.log", log: "zookeeper.log", bin: z.java, args: z.args,
		ready: func(ctx context.Context) error {
			_, err := z.Mode(ctx)
			return err
		}}.start(ctx)
	z.proc = p
	return err
}

// Mode asks the server with the four-letter command srvr and returns the mode it reports
// ("standalone" here).
func (z *ZooKeeper) Mode(ctx context.Context) (string, error) {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", z.Addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return "", err
	}
	reply, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(reply))
	for sc.Scan() {
		if mode, ok := strings.CutPrefix(sc.Text(), "Mode: "); ok {
			return mode, nil
		}
	}
	return "", fmt.Errorf("srvr reported no mode: %q", reply)
}

// Stop terminates the server, killing it if it does not exit within 10 seconds. Stopping a
// server that is not running does nothing.
func (z *ZooKeeper) Stop() error {
	z.proc.stop(10 * time.Second)
	return nil
}

// Logs returns the tail of the server's log, for failure messages.
func (z *ZooKeeper) Logs() string {
	return tail(filepath.Join(z.Dir, "zookeeper.log"))
}

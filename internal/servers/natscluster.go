package servers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of nats-server processes on loopback, each with its own
// store: a node can be killed with SIGKILL and started again, which the in-process cluster of
// StartNATSCluster cannot (its Shutdown is orderly).
type NATSCluster struct {
	Nodes []*NATSNode
}

// NATSNode is one server of a cluster.
type NATSNode struct {
	Name string
	URL  string // nats://127.0.0.1:port
	dir  string
	bin  string
	proc *process
}

// NATSServerPackage is what `go build` makes the nats-server binary of: the version go.mod pins,
// the one the in-process server of the other tests runs.
const NATSServerPackage = "github.com/nats-io/nats-server/v2"

// StartNATSProcesses starts n nats-server processes (bin: the binary, built from NATSServerPackage)
// routed into one JetStream cluster (n 1: a single server), each under dir, and waits until JetStream answers on every
// node (its meta leader elected). syncAlways makes each node sync every write before it is
// acknowledged (`sync_interval: always`).
func StartNATSProcesses(ctx context.Context, dir, bin string, n int, syncAlways bool) (*NATSCluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	sync := ""
	if syncAlways {
		sync = "  sync_interval: always\n"
	}
	c := &NATSCluster{}
	for i := range n {
		node := &NATSNode{Name: fmt.Sprintf("n%d", i+1), URL: fmt.Sprintf("nats://127.0.0.1:%d", ports[i]), bin: bin,
			dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		if err := os.MkdirAll(node.dir, 0o755); err != nil {
			return nil, err
		}
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n%s}\n",
			node.Name, ports[i], filepath.Join(node.dir, "js"), sync)
		if n > 1 { // one node is a server of its own, as deploy/nats/nats.conf runs it
			conf += fmt.Sprintf("cluster {\n  name: podium\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n", ports[n+i], strings.Join(routes, ", "))
		}
		if err := os.WriteFile(filepath.Join(node.dir, "nats.conf"), []byte(conf), 0o644); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}
	// All at once: JetStream answers on none until a majority has elected its meta leader.
	for _, node := range c.Nodes {
		if node.proc, err = startProcess(node.dir, "nats.log", bin, node.args()); err != nil {
			c.Stop()
			return nil, fmt.Errorf("servers: nats-server %s: %w", node.Name, err)
		}
	}
	for _, node := range c.Nodes {
		if err := node.proc.waitReady(ctx, 60*time.Second, "nats-server "+node.Name, node.URL, filepath.Join(node.dir, "nats.log"), node.ready); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// URLs are the nodes' client URLs, comma-separated, as NATS_URL takes them.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL
	}
	return strings.Join(urls, ",")
}

// Node is the node named name (n1, n2, ...), nil when there is none.
func (c *NATSCluster) Node(name string) *NATSNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Stop stops every node still running.
func (c *NATSCluster) Stop() {
	for _, n := range c.Nodes {
		if n.proc != nil && !n.proc.exited() {
			n.proc.stop(10 * time.Second)
		}
	}
}

// Start starts the node again, with the store it had, and waits until JetStream answers on it.
func (n *NATSNode) Start(ctx context.Context) error {
	p, err := launch{name: "nats-server " + n.Name, dir: n.dir, out: "nats.log", log: "nats.log", addr: n.URL, bin: n.bin,
		args: n.args(), ready: n.ready}.start(ctx)
	n.proc = p
	return err
}

func (n *NATSNode) args() []string { return []string{"-c", filepath.Join(n.dir, "nats.conf")} }

// ready asks JetStream for the account's information: it answers once the cluster has a leader.
func (n *NATSNode) ready(ctx context.Context) error {
	nc, err := nats.Connect(n.URL, nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = js.AccountInfo(actx)
	return err
}

// Kill ends the node with SIGKILL: no shutdown, no last sync.
func (n *NATSNode) Kill() error {
	if n.proc == nil || n.proc.exited() {
		return errors.New("servers: " + n.Name + " is not running")
	}
	return n.proc.kill()
}

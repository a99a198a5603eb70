package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/health/grpc_health_v1"
)

// ErrChecksumMismatch: a plugin binary's SHA-256 is not the one pinned in
// its Config; the manager refuses to start it. Match with errors.Is.
var ErrChecksumMismatch = plugin.ErrChecksumsDoNotMatch

// Config declares one tool plugin; it is the JSON the gateway's config will
// carry (one entry per tool).
type Config struct {
	// Name is the tool's name; the binary's Describe must return the same.
	// [a-z0-9_]{1,64}.
	Name string `json:"name"`
	// Path is the plugin binary.
	Path string `json:"path"`
	// SHA256 is the binary's SHA-256, 64 hex digits (`sha256sum path`).
	// go-plugin checks it before every start (SecureConfig); a mismatch
	// yields ErrChecksumMismatch.
	SHA256 string `json:"sha256"`
	// Env is the plugin's whole environment besides go-plugin's own
	// handshake variables: the host's environment is not inherited
	// (SkipHostEnv), so a tool sees only what config grants it.
	Env map[string]string `json:"env,omitempty"`
}

// Options tune a Manager; zero values take the defaults.
type Options struct {
	// Logger receives go-plugin's log and the plugins' stderr
	// (default: hclog to stderr at Warn).
	Logger hclog.Logger
	// HealthInterval is the period of the health check of each running
	// plugin: go-plugin's Ping (grpc.health.v1) with a StartTimeout deadline
	// (default 5 s).
	HealthInterval time.Duration
	// MinBackoff and MaxBackoff bound the delay before restarting a plugin
	// that crashed or failed to start: MinBackoff·2^(n-1) after the n-th
	// consecutive failure, at most MaxBackoff (defaults 200 ms and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// StableAfter is how long a plugin must stay up and healthy before its
	// failure count resets (default 1 min), so a crash loop backs off.
	StableAfter time.Duration
	// StartTimeout bounds one start: exec, handshake, Describe (default 10 s).
	StartTimeout time.Duration
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = hclog.New(&hclog.LoggerOptions{Name: "molly.plugins", Level: hclog.Warn})
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 5 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 200 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(30*time.Second, o.MinBackoff)
	}
	if o.StableAfter <= 0 {
		o.StableAfter = time.Minute
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Second
	}
}

// Manager runs the configured tool plugins: it starts them all in
// NewManager, health-checks them, restarts a crashed one with exponential
// backoff and stops them all in Close. Its methods are safe for concurrent
// use.
type Manager struct {
	opts    Options
	plugins map[string]*managed
	names   []string // sorted

	kick chan struct{} // wakes the supervisor early
	stop chan struct{}
	done chan struct{}

	closeOnce sync.Once
}

var nameRE = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// NewManager validates cfgs, starts every plugin and the supervisor. If any
// plugin fails to start (bad checksum, failed handshake, wrong name) it
// stops the ones it started and returns the error: a misconfigured tool
// fails provisioning rather than limping.
func NewManager(cfgs []Config, opts Options) (*Manager, error) {
	opts.defaults()
	m := &Manager{
		opts:    opts,
		plugins: map[string]*managed{},
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for i, c := range cfgs {
		if !nameRE.MatchString(c.Name) {
			return nil, fmt.Errorf("plugins: config[%d].name %q must match %s", i, c.Name, nameRE)
		}
		if _, dup := m.plugins[c.Name]; dup {
			return nil, fmt.Errorf("plugins: config[%d].name %q is declared twice", i, c.Name)
		}
		if c.Path == "" {
			return nil, fmt.Errorf("plugins: config[%d] (%s): path is empty", i, c.Name)
		}
		sum, err := hex.DecodeString(c.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("plugins: config[%d] (%s): sha256 must be 64 hex digits", i, c.Name)
		}
		for k := range c.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return nil, fmt.Errorf("plugins: config[%d] (%s): env name %q is invalid", i, c.Name, k)
			}
		}
		m.plugins[c.Name] = &managed{cfg: c, sum: sum, m: m}
		m.names = append(m.names, c.Name)
	}
	sort.Strings(m.names)
	for _, n := range m.names {
		p := m.plugins[n]
		p.mu.Lock()
		err := p.start()
		p.mu.Unlock()
		if err != nil {
			m.killAll()
			return nil, err
		}
	}
	go m.supervise()
	return m, nil
}

// Names returns the configured tool names, sorted.
func (m *Manager) Names() []string { return append([]string(nil), m.names...) }

// Describe returns the Description the named plugin gave at its last start.
// Errors: *ToolError with Code "not_found" for an unknown name.
func (m *Manager) Describe(name string) (Description, error) {
	p, ok := m.plugins[name]
	if !ok {
		return Description{}, Errorf(CodeNotFound, "no tool %q", name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.desc, nil
}

// Invoke calls the named tool. The error is always a *ToolError: the tool's
// own, "not_found" for an unknown tool, or "unavailable" when the plugin is
// down (restarting, backing off) or died or hung up mid-call; in that last
// case the manager restarts it. After "unavailable" the side effect may or
// may not have happened: retry with the same IdempotencyKey.
func (m *Manager) Invoke(ctx context.Context, name string, inv Invocation) (json.RawMessage, error) {
	p, ok := m.plugins[name]
	if !ok {
		return nil, Errorf(CodeNotFound, "no tool %q", name)
	}
	tool, client, err := p.ensure()
	if err != nil {
		return nil, err
	}
	res, err := tool.Invoke(ctx, inv)
	if err == nil {
		return res, nil
	}
	var te *ToolError
	if errors.As(err, &te) {
		return nil, te
	}
	if ctx.Err() != nil {
		return nil, Errorf(CodeUnavailable, "tool %s: call abandoned: %v", name, ctx.Err())
	}
	// A transport failure: find out whether the plugin is gone.
	if perr := ping(tool, p.m.opts.StartTimeout); perr != nil {
		p.markDead(client, fmt.Errorf("died mid-call: %v", err))
	}
	return nil, Errorf(CodeUnavailable, "tool %s failed mid-call: %v", name, err)
}

// PIDs returns the process id of each running plugin by tool name (a plugin
// that is down is absent). For tests and the admin route.
func (m *Manager) PIDs() map[string]int {
	out := map[string]int{}
	for n, p := range m.plugins {
		p.mu.Lock()
		if p.client != nil && !p.client.Exited() {
			out[n] = p.pid
		}
		p.mu.Unlock()
	}
	return out
}

// Close stops the supervisor and every plugin (go-plugin's Kill: a graceful
// shutdown, then SIGKILL after 2 s) and waits for them. It returns nil; a
// second call does nothing.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		close(m.stop)
		<-m.done
		m.killAll()
	})
	return nil
}

func (m *Manager) killAll() {
	var wg sync.WaitGroup
	for _, p := range m.plugins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.mu.Lock()
			defer p.mu.Unlock()
			p.closed = true
			if p.client != nil {
				p.client.Kill()
				p.client, p.tool = nil, nil
			}
		}()
	}
	wg.Wait()
}

// supervise restarts plugins whose backoff has elapsed and health-checks
// the running ones every HealthInterval. It ticks every MinBackoff (at
// least 50 ms) so a restart is not late by more than that.
func (m *Manager) supervise() {
	defer close(m.done)
	t := time.NewTicker(max(m.opts.MinBackoff, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		case <-m.kick:
		}
		for _, n := range m.names {
			m.plugins[n].check()
		}
	}
}

func (m *Manager) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// managed is one plugin's state. mu guards everything below it; a start runs
// under mu, so callers of that plugin wait for it (bounded by StartTimeout).
type managed struct {
	cfg Config
	sum []byte
	m   *Manager

	mu       sync.Mutex
	closed   bool
	client   *plugin.Client // nil while down
	tool     Tool
	desc     Description
	pid      int
	started  time.Time
	lastPing time.Time
	failures int       // consecutive failures, for the backoff
	next     time.Time // earliest restart
	lastErr  error
}

func (p *managed) backoff() time.Duration {
	d := p.m.opts.MinBackoff
	for i := 1; i < p.failures && d < p.m.opts.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.m.opts.MaxBackoff)
}

// fail records a failure under mu and schedules the restart.
func (p *managed) fail(err error) {
	p.failures++
	p.lastErr = err
	p.next = time.Now().Add(p.backoff())
	p.m.opts.Logger.Warn("tool plugin down", "tool", p.cfg.Name, "error", err, "failures", p.failures, "restart_in", p.backoff())
}

// start launches the plugin under mu. Errors name the tool.
func (p *managed) start() error {
	cfg, o := p.cfg, p.m.opts
	cmd := exec.Command(cfg.Path)
	keys := make([]string, 0, len(cfg.Env))
	for k := range cfg.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cmd.Env = []string{} // non-nil: exec must not fall back to the host's environment
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+cfg.Env[k])
	}
	setParentDeathSignal(cmd)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          plugin.PluginSet{pluginName: &toolPlugin{}},
		Cmd:              cmd,
		SecureConfig:     &plugin.SecureConfig{Checksum: p.sum, Hash: sha256.New()},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		SkipHostEnv:      true,
		StartTimeout:     o.StartTimeout,
		Logger:           o.Logger.Named(cfg.Name),
	})
	tool, desc, err := dispense(client, o.StartTimeout)
	if err == nil && desc.Name != cfg.Name {
		err = fmt.Errorf("it describes itself as %q", desc.Name)
	}
	if err == nil && !desc.SideEffect.Valid() {
		err = fmt.Errorf("side effect %q is not read, write or money", desc.SideEffect)
	}
	if err != nil {
		client.Kill()
		err = fmt.Errorf("plugins: starting tool %s (%s): %w", cfg.Name, cfg.Path, err)
		p.fail(err)
		return err
	}
	now := time.Now()
	p.client, p.tool, p.desc = client, tool, desc
	p.pid = 0
	if cmd.Process != nil {
		p.pid = cmd.Process.Pid
	}
	p.started, p.lastPing, p.lastErr = now, now, nil
	return nil
}

func dispense(client *plugin.Client, timeout time.Duration) (Tool, Description, error) {
	rpc, err := client.Client()
	if err != nil {
		return nil, Description{}, err
	}
	raw, err := rpc.Dispense(pluginName)
	if err != nil {
		return nil, Description{}, err
	}
	tool, ok := raw.(Tool)
	if !ok {
		return nil, Description{}, fmt.Errorf("dispensed %T, not a Tool", raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	desc, err := tool.Describe(ctx)
	if err != nil {
		return nil, Description{}, fmt.Errorf("describe: %w", err)
	}
	return tool, desc, nil
}

// ensure returns the running tool, starting it first when it is down and its
// backoff has elapsed. Errors are *ToolError "unavailable".
func (p *managed) ensure() (Tool, *plugin.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, Errorf(CodeUnavailable, "tool %s: the manager is closed", p.cfg.Name)
	}
	if p.client != nil && p.client.Exited() {
		p.client.Kill()
		p.client, p.tool = nil, nil
		p.fail(errors.New("process exited"))
	}
	if p.client == nil {
		if wait := time.Until(p.next); wait > 0 {
			return nil, nil, Errorf(CodeUnavailable, "tool %s is down (%v); restart in %v", p.cfg.Name, p.lastErr, wait.Round(time.Millisecond))
		}
		if err := p.start(); err != nil {
			return nil, nil, Errorf(CodeUnavailable, "%v", err)
		}
	}
	return p.tool, p.client, nil
}

// markDead retires client if it is still the current one and schedules a
// restart; a newer client started meanwhile is left alone.
func (p *managed) markDead(client *plugin.Client, err error) {
	p.mu.Lock()
	if p.client == client && client != nil {
		client.Kill()
		p.client, p.tool = nil, nil
		p.fail(err)
	}
	p.mu.Unlock()
	p.m.wake()
}

// check is the supervisor's visit: restart when due, ping when due.
func (p *managed) check() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	if p.client == nil || p.client.Exited() {
		p.mu.Unlock()
		_, _, _ = p.ensure() // restarts when the backoff has elapsed
		return
	}
	client, tool, due := p.client, p.tool, time.Since(p.lastPing) >= p.m.opts.HealthInterval
	p.mu.Unlock()
	if !due {
		return
	}
	if err := ping(tool, p.m.opts.StartTimeout); err != nil {
		p.markDead(client, fmt.Errorf("health check: %w", err))
		return
	}
	p.mu.Lock()
	if p.client == client {
		p.lastPing = time.Now()
		if p.failures > 0 && time.Since(p.started) >= p.m.opts.StableAfter {
			p.failures = 0
		}
	}
	p.mu.Unlock()
}

// ping is go-plugin's health check (what Client.Ping sends: grpc.health.v1
// Check for service "plugin", which the plugin side registers) with a
// deadline, which go-plugin's Ping lacks: a hung plugin must fail its check,
// not hang the supervisor.
func ping(tool Tool, timeout time.Duration) error {
	tc, ok := tool.(toolClient)
	if !ok {
		return fmt.Errorf("not a gRPC tool client: %T", tool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := grpc_health_v1.NewHealthClient(tc.conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: plugin.GRPCServiceName})
	if err != nil {
		return err
	}
	if st := resp.GetStatus(); st != grpc_health_v1.HealthCheckResponse_SERVING {
		return fmt.Errorf("health status %v", st)
	}
	return nil
}

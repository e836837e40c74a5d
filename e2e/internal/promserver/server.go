package promserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// Options configures Start.
type Options struct {
	// Binary is the prometheus executable. Default: "prometheus" on PATH.
	Binary string
	// WorkDir receives the configuration (prometheus.yml), the TSDB (data/)
	// and the server's output (prometheus.log). Required; never removed.
	WorkDir string
	// Job names the scrape job. Default "workload-ca".
	Job string
	// Targets are host:port addresses scraped at /metrics over HTTP.
	Targets []string
	// ScrapeInterval is how often targets are scraped (also the scrape
	// timeout). Default 1s.
	ScrapeInterval time.Duration
	// ReadyTimeout bounds the wait for /-/ready. Default 30s.
	ReadyTimeout time.Duration
}

// Server is a running Prometheus server.
type Server struct {
	opts    Options
	addr    string
	proc    *proc.Process
	logFile *os.File
	client  *http.Client
}

// Start writes the configuration, starts Prometheus on a free port of
// 127.0.0.1 and waits until /-/ready answers 200. ctx bounds start-up
// only. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.WorkDir == "" {
		return nil, errors.New("promserver: WorkDir is required")
	}
	if opts.Binary == "" {
		opts.Binary = "prometheus"
	}
	if opts.Job == "" {
		opts.Job = "workload-ca"
	}
	if opts.ScrapeInterval == 0 {
		opts.ScrapeInterval = time.Second
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	bin, err := lookPath(opts.Binary)
	if err != nil {
		return nil, err
	}
	opts.Binary = bin
	if err := os.MkdirAll(filepath.Join(opts.WorkDir, "data"), 0o700); err != nil {
		return nil, fmt.Errorf("promserver: %w", err)
	}
	if err := os.WriteFile(ConfigPath(opts.WorkDir), config(opts), 0o600); err != nil {
		return nil, fmt.Errorf("promserver: %w", err)
	}
	s := &Server{opts: opts, client: &http.Client{Timeout: 5 * time.Second}}
	if s.logFile, err = os.OpenFile(filepath.Join(opts.WorkDir, "prometheus.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return nil, fmt.Errorf("promserver: %w", err)
	}
	if err = proc.RetryPorts(func() error { return s.start(ctx) }); err != nil {
		_ = s.proc.Kill(10 * time.Second)
		_ = s.logFile.Close()
		return nil, fmt.Errorf("prometheus (work dir %s): %w", opts.WorkDir, err)
	}
	return s, nil
}

// ConfigPath is where Start writes the configuration in workDir.
func ConfigPath(workDir string) string { return filepath.Join(workDir, "prometheus.yml") }

// config renders prometheus.yml. Addresses and the job name are written as
// JSON strings, which YAML reads as they are.
func config(o Options) []byte {
	targets, _ := json.Marshal(o.Targets)
	job, _ := json.Marshal(o.Job)
	iv := o.ScrapeInterval.String()
	return fmt.Appendf(nil, `global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
scrape_configs:
  - job_name: %[2]s
    metrics_path: /metrics
    static_configs:
      - targets: %[3]s
`, iv, job, targets)
}

func (s *Server) start(ctx context.Context) error {
	ports, err := proc.FreePorts(1)
	if err != nil {
		return err
	}
	s.addr = "127.0.0.1:" + strconv.Itoa(ports[0])
	args := []string{
		"--config.file=" + ConfigPath(s.opts.WorkDir),
		"--storage.tsdb.path=" + filepath.Join(s.opts.WorkDir, "data"),
		"--web.listen-address=" + s.addr,
		"--log.level=info",
	}
	if s.proc, err = proc.Start("prometheus", s.opts.Binary, args, nil, s.logFile, s.logFile); err != nil {
		return err
	}
	return s.waitReady(ctx)
}

// waitReady polls /-/ready every 100ms until it answers 200, Prometheus
// exits, or ReadyTimeout or ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-s.proc.Done():
			return s.proc.StartupError()
		case <-ctx.Done():
			return fmt.Errorf("prometheus not ready after %v: %w; last output:\n%s", s.opts.ReadyTimeout, err, s.proc.Tail())
		case <-tick.C:
		}
	}
}

func (s *Server) ready(ctx context.Context) error {
	body, code, err := s.get(ctx, "/-/ready")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("/-/ready: %d %s", code, strings.TrimSpace(string(body)))
	}
	return nil
}

// URL is the server's base URL, http://127.0.0.1:<port>.
func (s *Server) URL() string { return "http://" + s.addr }

// Tail returns the server's last output.
func (s *Server) Tail() string { return s.proc.Tail() }

// Pid returns the server's process id.
func (s *Server) Pid() int { return s.proc.Pid() }

// Stop asks Prometheus to stop (SIGTERM), kills it after 10s, and closes
// its log. It reports a non-zero exit status.
func (s *Server) Stop() error {
	return errors.Join(s.proc.Terminate(10*time.Second), s.logFile.Close())
}

// Result is one series of an instant query's vector.
type Result struct {
	Metric map[string]string
	Value  float64
}

// Query runs an instant query (/api/v1/query) and returns its vector.
func (s *Server) Query(ctx context.Context, expr string) ([]Result, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"` // [unix time, "value"]
		} `json:"result"`
	}
	if err := s.api(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %q, want vector", expr, data.ResultType)
	}
	out := make([]Result, 0, len(data.Result))
	for _, r := range data.Result {
		str, ok := r.Value[1].(string)
		if !ok {
			return nil, fmt.Errorf("query %q: value %v", expr, r.Value)
		}
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("query %q: %w", expr, err)
		}
		out = append(out, Result{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// Target is a scrape target as /api/v1/targets reports it.
type Target struct {
	ScrapeURL  string `json:"scrapeUrl"`
	Health     string `json:"health"` // up, down, unknown
	LastError  string `json:"lastError"`
	LastScrape string `json:"lastScrape"`
}

// Targets returns the active scrape targets, for diagnostics.
func (s *Server) Targets(ctx context.Context) ([]Target, error) {
	var data struct {
		ActiveTargets []Target `json:"activeTargets"`
	}
	err := s.api(ctx, "/api/v1/targets?state=active", &data)
	return data.ActiveTargets, err
}

// api GETs an HTTP API path and decodes the "data" of a success response.
func (s *Server) api(ctx context.Context, path string, data any) error {
	body, code, err := s.get(ctx, path)
	if err != nil {
		return err
	}
	var resp struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("%s: %d %q: %w", path, code, body, err)
	}
	if resp.Status != "success" {
		return fmt.Errorf("%s: %d %s: %s", path, code, resp.ErrorType, resp.Error)
	}
	return json.Unmarshal(resp.Data, data)
}

func (s *Server) get(ctx context.Context, path string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+path, http.NoBody)
	if err != nil {
		return nil, 0, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return body, resp.StatusCode, err
}

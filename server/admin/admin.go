package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config configures the admin server.
type Config struct {
	Gatherer  prometheus.Gatherer
	Readiness *Readiness
	// Pprof exposes /debug/pprof/ (profiles reveal internals: keep the
	// admin port private).
	Pprof  bool
	Logger *slog.Logger
}

// Server is the admin HTTP server.
type Server struct {
	cfg  Config
	http *http.Server
}

// New returns the admin server.
func New(cfg Config) *Server {
	if cfg.Readiness == nil {
		cfg.Readiness = NewReadiness()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg}
	s.http = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	return s
}

// Handler routes the admin endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelError)}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Readiness.Err(ctx); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Serve serves on lis until ctx ends, then shuts down.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := s.http.Shutdown(shutdown)
	if serveErr := <-errc; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}

package keystore

import (
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/ca"
)

// DirWatcherConfig configures a DirWatcher.
type DirWatcherConfig struct {
	Dir string
	// Root: the directory holds a plug-in root CA (the layouts of
	// LoadRootDir), not the CA's own signing material.
	Root bool
	// Key is the signing key when it is held outside the directory (see
	// OpenKey); nil: the directory's key file.
	Key crypto.Signer
	// Apply installs newly loaded material; an error refuses it.
	Apply func(*ca.Material) error
	// Interval between polls (default 5s). Polling works the same for
	// files edited in place and for Kubernetes volumes, which swap a
	// symlink.
	Interval time.Duration
	Clock    clock.WithTicker
	Logger   *slog.Logger
}

// DirWatcher reloads CA material when the files of its directory change. A
// change that does not load or validate is refused and logged once; the
// material in use keeps serving until a good change arrives.
type DirWatcher struct {
	cfg  DirWatcherConfig
	seen [sha256.Size]byte // fingerprint of the content last tried
}

// NewDirWatcher returns a watcher whose baseline is the directory's current
// content, which the caller has already loaded.
func NewDirWatcher(cfg DirWatcherConfig) (*DirWatcher, error) {
	if cfg.Dir == "" || cfg.Apply == nil {
		return nil, errors.New("keystore: watcher needs a directory and an apply function")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &DirWatcher{cfg: cfg}
	fp, err := fingerprint(cfg.Dir)
	if err != nil {
		return nil, err
	}
	w.seen = fp
	return w, nil
}

// Run polls until ctx ends.
func (w *DirWatcher) Run(ctx context.Context) error {
	t := w.cfg.Clock.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			w.Poll()
		}
	}
}

// Poll checks the directory once and reports whether new material was
// installed.
func (w *DirWatcher) Poll() bool {
	log := w.cfg.Logger.With("dir", w.cfg.Dir)
	fp, err := fingerprint(w.cfg.Dir)
	if err != nil {
		log.Warn("reading CA material", "error", err.Error())
		return false
	}
	if fp == w.seen {
		return false
	}
	w.seen = fp
	load := loadDir
	if w.cfg.Root {
		load = loadRootDir
	}
	m, err := load(w.cfg.Dir, w.cfg.Key, w.cfg.Clock.Now())
	if err == nil {
		err = w.cfg.Apply(m)
	}
	if err != nil {
		log.Error("refused changed CA material; the previous CA keeps serving", "error", err.Error())
		return false
	}
	log.Info("reloaded CA material", "subject", m.Cert.Subject.String(), "not_after", m.Cert.NotAfter, "roots", len(m.Roots))
	return true
}

// fingerprint hashes the names and contents of every file of both layouts.
func fingerprint(dir string) ([sha256.Size]byte, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	defer r.Close()
	h := sha256.New()
	for _, l := range layouts() {
		for _, name := range []string{l.cert, l.key, l.roots, l.chain} {
			if name == "" {
				continue
			}
			b, err := r.ReadFile(name)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return [sha256.Size]byte{}, err
			}
			h.Write([]byte(name))
			h.Write([]byte{0})
			h.Write(b)
			h.Write([]byte{0})
		}
	}
	var fp [sha256.Size]byte
	h.Sum(fp[:0])
	return fp, nil
}

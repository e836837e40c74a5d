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
	// RetryRefused is how long refused content waits before it is tried
	// again unchanged (default 1m): material refused for the time (a
	// certificate not valid yet, roots removed while intermediates they
	// issued still live) can become acceptable without a file changing.
	RetryRefused time.Duration
	Clock        clock.WithTicker
	Logger       *slog.Logger
}

// DirWatcher reloads CA material when the files of its directory change. A
// change that does not load or validate is refused and logged once (its
// retries at debug level); the material in use keeps serving until a good
// change arrives or a retry of the refused one succeeds.
type DirWatcher struct {
	cfg  DirWatcherConfig
	seen [sha256.Size]byte // fingerprint of the content last tried
	// refused is whether the content last tried was refused, and retryAt
	// when it is tried again if it is still there.
	refused bool
	retryAt time.Time
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
	if cfg.RetryRefused <= 0 {
		cfg.RetryRefused = time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &DirWatcher{cfg: cfg}
	fp, err := fingerprint(cfg.Dir, w.layouts())
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

// layouts are the file layouts the watched directory may hold.
func (w *DirWatcher) layouts() []layout {
	if w.cfg.Root {
		return rootLayouts()
	}
	return layouts()
}

// Poll checks the directory once and reports whether new material was
// installed.
func (w *DirWatcher) Poll() bool {
	log := w.cfg.Logger.With("dir", w.cfg.Dir)
	fp, err := fingerprint(w.cfg.Dir, w.layouts())
	if err != nil {
		log.Warn("reading CA material", "error", err.Error())
		return false
	}
	now := w.cfg.Clock.Now()
	changed := fp != w.seen
	if !changed && (!w.refused || now.Before(w.retryAt)) {
		return false
	}
	w.seen = fp
	load := loadDir
	if w.cfg.Root {
		load = loadRootDir
	}
	m, err := load(w.cfg.Dir, w.cfg.Key, now)
	if err == nil {
		err = w.cfg.Apply(m)
	}
	if err != nil {
		// Once per change: a retry's error may differ only in the time
		// crypto/x509 puts in it.
		level := slog.LevelDebug
		if changed {
			level = slog.LevelError
		}
		log.Log(context.Background(), level, "refused changed CA material; the previous CA keeps serving", "error", err.Error(), "retry_in", w.cfg.RetryRefused)
		w.refused, w.retryAt = true, now.Add(w.cfg.RetryRefused)
		return false
	}
	w.refused = false
	log.Info("reloaded CA material", "subject", m.Cert.Subject.String(), "not_after", m.Cert.NotAfter, "roots", len(m.Roots))
	return true
}

// fingerprint hashes the names and contents of every file of ls.
func fingerprint(dir string, ls []layout) ([sha256.Size]byte, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	defer r.Close()
	h := sha256.New()
	for _, l := range ls {
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

package federation

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/workload-ca/workload-ca/internal/testca"
)

// bundleJSON is a bundle of theirs holding roots, as an endpoint serves it.
func bundleJSON(t testing.TB, roots ...*x509.Certificate) []byte {
	t.Helper()
	b := spiffebundle.FromX509Authorities(theirs, roots)
	b.SetRefreshHint(time.Minute)
	raw, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// hostilePeer serves h over https_web on loopback; the returned Peer
// fetches from it, trusting its certificate.
func hostilePeer(t *testing.T, h http.HandlerFunc) (*httptest.Server, Peer) {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv, Peer{TrustDomain: theirs, URL: srv.URL + "/bundle", Profile: ProfileWeb, WebRootsFile: testca.WritePEM(t, srv.Certificate()),
		RefreshInterval: time.Minute, MaxRoots: DefaultMaxRoots, FetchTimeout: 2 * time.Second, Ztunnel: true}
}

func mustFetcher(t *testing.T, p Peer) *fetcher {
	t.Helper()
	f, err := newFetcher(p, nil, MaxBundleBytes)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFetchRefusesAnOversizedBody: a peer streaming 20 MiB, announced or
// not, is refused after MaxBundleBytes, without the rest being read or
// held.
func TestFetchRefusesAnOversizedBody(t *testing.T) {
	const size = 20 << 20
	for name, announce := range map[string]bool{"streamed without a length": false, "with its length announced": true} {
		t.Run(name, func(t *testing.T) {
			var written atomic.Int64
			done := make(chan struct{})
			_, p := hostilePeer(t, func(w http.ResponseWriter, _ *http.Request) {
				defer close(done)
				if announce {
					w.Header().Set("Content-Length", strconv.Itoa(size))
				}
				chunk := []byte("{" + strings.Repeat(" ", 32<<10-1))
				for written.Load() < size {
					n, err := w.Write(chunk)
					written.Add(int64(n))
					if err != nil {
						return
					}
					chunk[0] = ' '
				}
			})
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := mustFetcher(t, p).fetch(t.Context())
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrBundleRefused) || !strings.Contains(err.Error(), "at most 524288") && !strings.Contains(err.Error(), "over 524288 bytes") {
				t.Fatalf("fetch: %v, want the body refused over 512 KiB", err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the peer is still writing: the fetch did not hang up")
			}
			if n := written.Load(); n >= size {
				t.Errorf("the peer wrote all %d bytes; want the fetch to hang up early", n)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
				t.Errorf("the fetch allocated %d MiB, want a bound near the 512 KiB cap", alloc>>20)
			}
			t.Logf("the peer wrote %d KiB before the fetch hung up; %d KiB allocated meanwhile", written.Load()>>10, (after.TotalAlloc-before.TotalAlloc)>>10)
		})
	}
}

// TestFetchTimesOutAStalledPeer: a peer that accepts and says nothing,
// sends no headers, or stops mid-body fails the fetch at its timeout.
func TestFetchTimesOutAStalledPeer(t *testing.T) {
	good := bundleJSON(t, testca.NewRoot(t, testca.P256).Cert)
	stallHeaders := func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	stallBody := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(good)))
		_, _ = w.Write(good[:len(good)/2])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
	for name, h := range map[string]http.HandlerFunc{"before the headers": stallHeaders, "mid-body": stallBody, "in the TLS handshake": nil} {
		t.Run(name, func(t *testing.T) {
			_, p := hostilePeer(t, h)
			if h == nil {
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = lis.Close() })
				go func() {
					for { // accept and never speak
						c, err := lis.Accept()
						if err != nil {
							return
						}
						t.Cleanup(func() { _ = c.Close() })
					}
				}()
				p.URL = "https://" + lis.Addr().String() + "/"
			}
			p.FetchTimeout = 300 * time.Millisecond
			start := time.Now()
			_, err := mustFetcher(t, p).fetch(t.Context())
			if err == nil {
				t.Fatal("fetch from a stalled peer: no error")
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("fetch took %v, want about its 300ms timeout", took)
			}
		})
	}
}

// TestFetchRefusesRedirects: a redirect, to plain http or to https, is
// refused and not followed.
func TestFetchRefusesRedirects(t *testing.T) {
	good := bundleJSON(t, testca.NewRoot(t, testca.P256).Cert)
	var followed atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { followed.Add(1); _, _ = w.Write(good) }))
	t.Cleanup(plain.Close)
	for name, target := range map[string]string{"to plain http": plain.URL + "/bundle", "to https": "/elsewhere"} {
		t.Run(name, func(t *testing.T) {
			_, p := hostilePeer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/elsewhere" {
					followed.Add(1)
					_, _ = w.Write(good)
					return
				}
				http.Redirect(w, r, target, http.StatusFound)
			})
			_, err := mustFetcher(t, p).fetch(t.Context())
			if !errors.Is(err, errRedirect) {
				t.Fatalf("fetch: %v, want the redirect refused", err)
			}
			if n := followed.Load(); n != 0 {
				t.Errorf("the redirect was followed %d times", n)
			}
		})
	}
}

// TestFetchRefusesPlainHTTPURLs: an http:// (or user-info) URL is
// refused by the configuration check and by the fetcher itself.
func TestFetchRefusesPlainHTTPURLs(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:8080/bundle", "https://user:secret@127.0.0.1/bundle"} {
		yaml := `trustDomains: [{trustDomain: a.example, url: "` + u + `", profile: https_web}]`
		path := filepath.Join(t.TempDir(), "f.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path, ours); err == nil || !strings.Contains(err.Error(), "want an https:// URL") {
			t.Errorf("Load with url %s: %v, want it refused", u, err)
		}
	}
	p := Peer{TrustDomain: theirs, URL: "http://127.0.0.1:8080/bundle", Profile: ProfileWeb, FetchTimeout: time.Second}
	if _, err := newFetcher(p, nil, MaxBundleBytes); err == nil {
		t.Error("newFetcher with an http:// URL: no error")
	}
}

// TestFetchRefusesWhatIsNotABundle: an error status or a body that is not
// a JSON object is a failed fetch that says so.
func TestFetchRefusesWhatIsNotABundle(t *testing.T) {
	for name, tc := range map[string]struct {
		status  int
		body    string
		wantErr string
	}{
		"not found":                   {status: http.StatusNotFound, body: "{}", wantErr: "404 Not Found, want 200 OK"},
		"server error":                {status: http.StatusInternalServerError, wantErr: "500 Internal Server Error"},
		"an html page":                {status: http.StatusOK, body: "<html>maintenance</html>", wantErr: "not a JSON object"},
		"an empty body":               {status: http.StatusOK, wantErr: "not a JSON object"},
		"a JSON object, not a bundle": {status: http.StatusOK, body: `{"hello": 1}`, wantErr: "refused"},
	} {
		t.Run(name, func(t *testing.T) {
			_, p := hostilePeer(t, func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			})
			if _, err := mustFetcher(t, p).fetch(context.Background()); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("fetch: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

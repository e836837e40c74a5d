package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// binaryFlags collects --binary os/arch=path.
type binaryFlags map[string]string

func (b binaryFlags) String() string { return fmt.Sprint(map[string]string(b)) }

func (b binaryFlags) Set(v string) error {
	plat, path, ok := strings.Cut(v, "=")
	if !ok || plat == "" || path == "" {
		return fmt.Errorf("%q: want os/arch=path", v)
	}
	b[plat] = path
	return nil
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	bins := binaryFlags{}
	fs.Var(bins, "binary", "os/arch=path of a static workload-ca binary (repeat per platform)")
	version := fs.String("version", "dev", "image version (label)")
	revision := fs.String("revision", "", "source commit (label)")
	created := fs.String("created", "", "creation time, Unix seconds (SOURCE_DATE_EPOCH; default: now)")
	layoutDir := fs.String("layout", "", "write the image index as an OCI image layout in this directory (replaced)")
	tarPath := fs.String("tarball", "", "write the image of --tarball-platform here, for docker load / podman load")
	tarPlatform := fs.String("tarball-platform", "linux/amd64", "platform of --tarball")
	tag := fs.String("tag", "workload-ca:dev", "image reference (registry/repo:tag): the name inside --tarball and the ref.name of --layout's index")
	push := fs.String("push", "", "push the image index to this reference (registry/repo:tag)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *layoutDir == "" && *tarPath == "" && *push == "" {
		return errors.New("nothing to do: give --layout, --tarball or --push")
	}
	spec := Spec{Binaries: bins, Version: *version, Revision: *revision, Created: time.Now().UTC().Truncate(time.Second)}
	if *created != "" {
		secs, err := strconv.ParseInt(*created, 10, 64)
		if err != nil {
			return fmt.Errorf("--created %q: %w", *created, err)
		}
		spec.Created = time.Unix(secs, 0).UTC()
	}
	idx, err := Build(spec)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if *layoutDir != "" {
		if err := writeLayout(*layoutDir, idx, *tag); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "OCI layout %s: %s\n", *layoutDir, digest)
	}
	if *tarPath != "" {
		if err := writeTarball(*tarPath, idx, *tarPlatform, *tag); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "tarball %s: %s (%s)\n", *tarPath, *tag, *tarPlatform)
	}
	if *push != "" {
		ref, err := name.ParseReference(*push)
		if err != nil {
			return fmt.Errorf("--push: %w", err)
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		fmt.Fprintf(stdout, "pushed %s@%s\n", ref, digest)
	}
	return nil
}

// writeLayout replaces dir with an OCI image layout whose index.json holds
// idx, named ref (the org.opencontainers.image.ref.name skopeo's
// oci:dir:ref and crane's layout commands look up).
func writeLayout(dir string, idx v1.ImageIndex, ref string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
}

// writeTarball writes idx's image for platform as a docker-load tarball.
func writeTarball(path string, idx v1.ImageIndex, platform, tag string) error {
	want, err := v1.ParsePlatform(platform)
	if err != nil {
		return fmt.Errorf("--tarball-platform: %w", err)
	}
	img, err := imageFor(idx, *want)
	if err != nil {
		return err
	}
	t, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	return tarball.WriteToFile(path, t, img)
}

// imageFor returns the image of idx built for platform.
func imageFor(idx v1.ImageIndex, platform v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.Equals(platform) {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no image for %s", platform.String())
}

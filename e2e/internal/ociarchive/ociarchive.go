// Package ociarchive writes a single-layer container image, made from files on
// this machine, as an OCI image layout archive that containerd's importer
// (`ctr images import`) reads and names from the io.containerd.image.name
// annotation. It is what the e2e cluster uses for the images it cannot pull:
// istiod, istio-cni, the pause sandbox and the test app. gozt's own image is
// made by `make image` (deploy/image).
//
// The layer is an uncompressed tar (a valid OCI layer media type), so the
// archive is written in one pass with no compression cost.
package ociarchive

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// File is one entry of the image's filesystem.
type File struct {
	// Path is the absolute path inside the image.
	Path string
	// Src is the host file whose contents are copied. Empty for a directory
	// or a symlink.
	Src string
	// Link, when set, makes the entry a symlink to Link.
	Link string
	// Mode is the file mode; if zero, 0755 for files and directories.
	Mode os.FileMode
	// Dir reports whether the entry is a directory.
	Dir bool
}

// Image is what to build.
type Image struct {
	// Ref is the full image reference, e.g. localhost/istio/pilot:1.31-dev.
	Ref        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	// User is the image's default user; empty means root.
	User string
}

// epoch is the time of every file and of the image, so that the same files
// make the same digest.
var epoch = time.Unix(0, 0).UTC()

// Write writes img as an OCI layout archive to out.
func Write(out string, img Image) error {
	layer, err := os.CreateTemp("", "ociarchive-layer-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	h := sha256.New()
	size, err := writeLayer(io.MultiWriter(layer, h), img.Files)
	if err != nil {
		return fmt.Errorf("layer of %s: %w", img.Ref, err)
	}
	layerDigest := "sha256:" + hex.EncodeToString(h.Sum(nil))

	env := img.Env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	config := map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": img.Entrypoint, "Cmd": img.Cmd, "Env": env,
			"WorkingDir": img.WorkingDir, "User": img.User,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	manifestJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", configJSON),
		"layers": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.layer.v1.tar",
			"digest":    layerDigest,
			"size":      size,
		}},
	})
	if err != nil {
		return err
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifestJSON)
	md["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	md["annotations"] = map[string]string{
		"io.containerd.image.name":          img.Ref,
		"org.opencontainers.image.ref.name": tagOf(img.Ref),
	}
	indexJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return err
	}
	return writeArchive(out, layer, layerDigest, size, map[string][]byte{
		"oci-layout":         []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json":         indexJSON,
		blobPath(configJSON): configJSON, blobPath(manifestJSON): manifestJSON,
	})
}

func descriptor(mediaType string, b []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func blobPath(b []byte) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:")
}

// tagOf returns the tag of ref, or "latest".
func tagOf(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return "latest"
}

// writeArchive writes the layout: small files from blobs, then the layer.
func writeArchive(out string, layer *os.File, layerDigest string, size int64, blobs map[string][]byte) (err error) {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	tw := tar.NewWriter(f)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(blobs))
	for n := range blobs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b := blobs[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	name := "blobs/sha256/" + strings.TrimPrefix(layerDigest, "sha256:")
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: epoch}); err != nil {
		return err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.Copy(tw, layer); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}

// countingWriter counts what passes through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeLayer writes files, with every parent directory, as a tar to w and
// returns its size.
func writeLayer(w io.Writer, files []File) (int64, error) {
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	dirs := map[string]bool{}
	var ensureDir func(string) error
	ensureDir = func(dir string) error {
		if dir == "/" || dir == "." || dirs[dir] {
			return nil
		}
		if err := ensureDir(path.Dir(dir)); err != nil {
			return err
		}
		dirs[dir] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dir, "/") + "/", Mode: 0o755, ModTime: epoch})
	}
	for _, f := range files {
		if err := writeEntry(tw, f, ensureDir, dirs); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	return cw.n, nil
}

func writeEntry(tw *tar.Writer, f File, ensureDir func(string) error, dirs map[string]bool) error {
	p := path.Clean(f.Path)
	if err := ensureDir(path.Dir(p)); err != nil {
		return err
	}
	mode := int64(f.Mode.Perm())
	if f.Mode&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	if mode == 0 {
		mode = 0o755
	}
	name := strings.TrimPrefix(p, "/")
	switch {
	case f.Dir:
		if dirs[p] {
			return nil
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch})
	case f.Link != "":
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777, ModTime: epoch})
	}
	src, err := os.Open(f.Src)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: st.Size(), ModTime: epoch}); err != nil {
		return err
	}
	_, err = io.Copy(tw, src)
	return err
}

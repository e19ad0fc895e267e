package testutil

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
)

// ociBlob is one content-addressed blob of an image layout.
type ociBlob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) ociBlob {
	sum := sha256.Sum256(data)
	return ociBlob{"sha256:" + hex.EncodeToString(sum[:]), data}
}

func descriptor(mediaType string, b ociBlob) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": b.digest, "size": len(b.data)}
}

// OCIImage writes an OCI image layout archive (for `ctr images import`)
// of one uncompressed layer holding file at /name, named ref, running
// entrypoint.
func OCIImage(path, ref, file, name string, entrypoint []string) error {
	bin, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	for _, d := range []string{"etc/", "tmp/", "dev/", "proc/", "sys/"} {
		if err := lw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return err
		}
	}
	if err := lw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))}); err != nil {
		return err
	}
	if _, err := lw.Write(bin); err != nil {
		return err
	}
	if err := lw.Close(); err != nil {
		return err
	}
	layerBlob := newBlob(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerBlob.digest}},
	})
	if err != nil {
		return err
	}
	configBlob := newBlob(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", configBlob),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layerBlob)},
	})
	if err != nil {
		return err
	}
	manifestBlob := newBlob(manifest)
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifestBlob)
	md["annotations"] = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	for _, b := range []ociBlob{layerBlob, configBlob, manifestBlob} {
		if err := add(fmt.Sprintf("blobs/sha256/%s", b.digest[len("sha256:"):]), b.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

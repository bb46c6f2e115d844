package wasmtools

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// The tool index.
//
// Loading a Go module takes ~100 ms of a core even from the compilation
// cache, most of it wazero decoding and validating the module. So that a
// restart can list every tool at once (and a run be offered all of them),
// each load records in the cache what it learned of the tool file: its
// stamp (size, modification time, inode), its sha256 and its manifest.
// At the next Open, a tool whose file and sidecar are as recorded is
// listed at once, marked Compiling; it is callable once it has loaded (a
// call waits for it, and it loads next). Whatever the index says, the
// load reads the file itself, and the loaded tool replaces what was
// listed; a file that no longer loads drops out of the list.

// indexVersion names the form of the index's entries.
const indexVersion = "1"

// fileStamp tells a file from a changed one without reading it.
type fileStamp struct {
	Size    int64  `json:"size"`
	ModTime int64  `json:"mtime_ns"`
	Inode   uint64 `json:"inode"`
}

func stampOf(fi os.FileInfo) fileStamp {
	return fileStamp{Size: fi.Size(), ModTime: fi.ModTime().UnixNano(), Inode: inode(fi)}
}

// indexEntry is what the index keeps of one tool.
type indexEntry struct {
	Stamp    fileStamp       `json:"stamp"`
	SHA256   string          `json:"sha256"`
	Sidecar  bool            `json:"sidecar"` // the manifest is the sidecar's content
	Manifest json.RawMessage `json:"manifest"`
}

// indexFile is where the index keeps the tool name of this registry's
// directory: several data directories may share one cache.
func (r *Registry) indexFile(name string) string {
	dir, err := filepath.Abs(r.cfg.Dir)
	if err != nil {
		dir = r.cfg.Dir
	}
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join(r.cfg.CacheDir, "index-v"+indexVersion, fmt.Sprintf("%x-%s.json", sum[:8], name))
}

// remember records a loaded tool in the index; nothing without a
// CacheDir. A failure to write is logged: the index only saves time.
func (r *Registry) remember(t *tool) {
	if r.cache == nil {
		return
	}
	e := indexEntry{Stamp: t.stamp, SHA256: t.info.SHA256, Sidecar: t.sidecar != nil, Manifest: t.manifest}
	data, err := json.Marshal(e)
	if err != nil {
		return
	}
	file := r.indexFile(t.info.Spec.Name)
	if old, err := os.ReadFile(file); err == nil && bytes.Equal(old, data) {
		return
	}
	r.keep(file, data)
}

// listed returns the tool name as the index knows it, not loaded, if its
// file and sidecar are still as they were when it was recorded.
func (r *Registry) listed(name string) (*tool, bool) {
	if r.cache == nil || !namePattern.MatchString(name) {
		return nil, false
	}
	data, err := os.ReadFile(r.indexFile(name))
	if err != nil {
		return nil, false
	}
	var e indexEntry
	if json.Unmarshal(data, &e) != nil {
		return nil, false
	}
	file := filepath.Join(r.cfg.Dir, name+".wasm")
	fi, err := os.Stat(file)
	if err != nil || !fi.Mode().IsRegular() || stampOf(fi) != e.Stamp {
		return nil, false
	}
	side, err := readSidecar(filepath.Join(r.cfg.Dir, name+".manifest.json"))
	if e.Sidecar && (err != nil || !bytes.Equal(side, e.Manifest)) || !e.Sidecar && !errors.Is(err, fs.ErrNotExist) {
		return nil, false
	}
	m, err := parseManifest(e.Manifest)
	if err != nil || m.Name != name {
		return nil, false
	}
	var sidecar []byte
	if e.Sidecar {
		sidecar = side
	}
	t := &tool{pending: true, info: describe(m, e.SHA256, sidecar, file)}
	t.info.Grants = configured(r.grantsFor(name, t.info.GrantDigest))
	t.info.Compiling = true
	t.targets = schemaTargets(t.info.Spec.InputSchema)
	return t, true
}

// configured is what grant would give from g, without opening anything:
// the grants listed for a tool not loaded yet.
func configured(g capabilities.Grants) capabilities.Grants {
	out := capabilities.Grants{Network: slices.Clone(g.Network), Env: slices.Clone(g.Env)}
	for _, fg := range g.FS {
		if path.IsAbs(fg.GuestPath) {
			fg.GuestPath = path.Clean(fg.GuestPath)
			out.FS = append(out.FS, fg)
		}
	}
	return out
}

// describe is the public description of a tool from its manifest, the
// hex sha256 of its file, its sidecar manifest (nil if none) and the
// file's path.
func describe(m *parsedManifest, sha256 string, sidecar []byte, file string) Tool {
	abs, err := filepath.Abs(file)
	if err != nil {
		abs = file
	}
	return Tool{
		Spec: keel.ToolSpec{
			Name:         m.Name,
			Version:      m.Version,
			Description:  m.Description,
			InputSchema:  m.InputSchema,
			OutputSchema: m.OutputSchema,
			SideEffects:  m.SideEffects,
		},
		Requests:    m.Requests,
		Labels:      m.Labels,
		SHA256:      sha256,
		GrantDigest: GrantDigest(sha256, sidecar),
		Path:        abs,
	}
}

package wasmtools_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/wasmtools"
)

// TestReadLimitsFile: tools.json sets the default limits of every tool
// call; a flag set on the command line wins over it, and a file with an
// unknown field or an impossible limit is refused.
func TestReadLimitsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "tools.json")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if l, err := wasmtools.ReadLimitsFile(filepath.Join(dir, "missing.json")); err != nil || l != (capabilities.Limits{}) {
		t.Fatalf("ReadLimitsFile(missing) = %+v, %v; want the defaults", l, err)
	}
	l, err := wasmtools.ReadLimitsFile(write(`{"limits":{"timeout_ms":30000,"memory_mib":512,"output_bytes":4096,"write_quota_bytes":1024}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := wasmtools.Config{WriteQuotaBytes: 7}.WithDefaultLimits(l)
	if got.CallTimeout != 30*time.Second || got.MemoryLimitMiB != 512 || got.MaxOutputBytes != 4096 || got.WriteQuotaBytes != 7 {
		t.Errorf("WithDefaultLimits = %v, %d MiB, %d, %d; want 30s, 512 MiB, 4096, and the flag's 7", got.CallTimeout, got.MemoryLimitMiB, got.MaxOutputBytes, got.WriteQuotaBytes)
	}
	for _, bad := range []string{`{"limits":{"cpu":1}}`, `{"limits":{"memory_mib":9000}}`, `{"limits":{"timeout_ms":-5}}`, `{"limits":{}} {}`} {
		if _, err := wasmtools.ReadLimitsFile(write(bad)); err == nil {
			t.Errorf("ReadLimitsFile(%s) = nil error, want it refused", bad)
		}
	}
}

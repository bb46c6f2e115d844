package wasmtools_test

import (
	"testing"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/wasmtools"
)

func TestDeclaredLimits(t *testing.T) {
	t.Parallel()
	defaults := capabilities.ToolLimits{
		CallTimeoutMS:    wasmtools.DefaultCallTimeout.Milliseconds(),
		MemoryLimitMiB:   wasmtools.DefaultMemoryLimitMiB,
		MaxOutputBytes:   wasmtools.DefaultMaxOutputBytes,
		WriteQuotaBytes:  wasmtools.DefaultWriteQuotaBytes,
		MinFreeDiskBytes: wasmtools.DefaultMinFreeDiskBytes,
		IdleUnloadMS:     wasmtools.DefaultIdleToolTimeout.Milliseconds(),
	}
	unlimited := defaults
	unlimited.WriteQuotaBytes, unlimited.MinFreeDiskBytes, unlimited.IdleUnloadMS = -1, -1, -1
	set := capabilities.ToolLimits{CallTimeoutMS: 2000, MemoryLimitMiB: 64, MaxOutputBytes: 4096,
		WriteQuotaBytes: 10, MinFreeDiskBytes: 20, IdleUnloadMS: 30000, AllowPrivateNetwork: true}
	tests := []struct {
		name string
		cfg  wasmtools.Config
		want capabilities.ToolLimits
	}{
		{"zero", wasmtools.Config{}, defaults},
		{"negative", wasmtools.Config{WriteQuotaBytes: -1, MinFreeDiskBytes: -5, IdleToolTimeout: -time.Second}, unlimited},
		{"set", wasmtools.Config{CallTimeout: 2 * time.Second, MemoryLimitMiB: 64, MaxOutputBytes: 4096,
			WriteQuotaBytes: 10, MinFreeDiskBytes: 20, IdleToolTimeout: 30 * time.Second, AllowPrivateNetwork: true}, set},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.DeclaredLimits(); got != tt.want {
				t.Errorf("Config.DeclaredLimits() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

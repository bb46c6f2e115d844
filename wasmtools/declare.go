package wasmtools

import "github.com/keel-runtime/keel/capabilities"

// DeclaredLimits returns the limits c puts on every tool call as
// env.describe declares them: what c leaves 0 is the default Open fills
// in, and a negative write quota, disk floor or idle timeout is -1 (no
// limit).
func (c Config) DeclaredLimits() capabilities.ToolLimits {
	orDefault := func(v, def int64) int64 {
		switch {
		case v < 0:
			return -1
		case v == 0:
			return def
		}
		return v
	}
	timeout := DefaultCallTimeout
	if c.CallTimeout > 0 {
		timeout = c.CallTimeout
	}
	memory := DefaultMemoryLimitMiB
	if c.MemoryLimitMiB > 0 {
		memory = min(c.MemoryLimitMiB, maxMemoryLimitMiB)
	}
	output := DefaultMaxOutputBytes
	if c.MaxOutputBytes > 0 {
		output = c.MaxOutputBytes
	}
	return capabilities.ToolLimits{
		CallTimeoutMS:       timeout.Milliseconds(),
		MemoryLimitMiB:      memory,
		MaxOutputBytes:      output,
		WriteQuotaBytes:     orDefault(c.WriteQuotaBytes, DefaultWriteQuotaBytes),
		MinFreeDiskBytes:    orDefault(c.MinFreeDiskBytes, DefaultMinFreeDiskBytes),
		IdleUnloadMS:        orDefault(c.IdleToolTimeout.Milliseconds(), DefaultIdleToolTimeout.Milliseconds()),
		AllowPrivateNetwork: c.AllowPrivateNetwork,
	}
}

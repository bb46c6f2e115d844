package daemon

import (
	"cmp"
	"fmt"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/wasmtools"
)

// ToolsConfigFile is the name of the tool sandbox's configuration in the
// data directory: the default limits of every tool call. Without it the
// defaults of wasmtools.Config apply (10 s, 256 MiB, 1 MiB of output, a
// 1 GiB write quota). docs/tools.md documents it.
const ToolsConfigFile = "tools.json"

// toolsFile is the JSON of ToolsConfigFile.
type toolsFile struct {
	// Limits are the defaults of every call. A tool's manifest may ask
	// for less, or for more where the user granted it (limit:KIND=VALUE).
	Limits capabilities.Limits `json:"limits"`
}

// readToolsFile reads path; a missing file is the empty configuration.
// Unknown fields and negative or impossible limits are errors.
func readToolsFile(path string) (toolsFile, error) {
	f, err := readConfigFile[toolsFile](path, "docs/tools.md")
	if err != nil {
		return f, err
	}
	if err := f.Limits.Check(); err != nil {
		return f, fmt.Errorf("%s: %w (see docs/tools.md)", path, err)
	}
	return f, nil
}

// applyToolLimits sets the call limits of c from the tools file, where a
// command-line flag (already in c) did not set them.
func (f toolsFile) applyToolLimits(c wasmtools.Config) wasmtools.Config {
	l := f.Limits
	c.CallTimeout = cmp.Or(c.CallTimeout, time.Duration(l.TimeoutMS)*time.Millisecond)
	c.MemoryLimitMiB = cmp.Or(c.MemoryLimitMiB, int(l.MemoryMiB))
	c.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, int(l.OutputBytes))
	c.WriteQuotaBytes = cmp.Or(c.WriteQuotaBytes, l.WriteQuotaBytes)
	return c
}

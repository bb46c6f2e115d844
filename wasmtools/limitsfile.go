package wasmtools

import (
	"cmp"
	"fmt"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/jsonfile"
)

// LimitsFile is the name of the tool sandbox's configuration in the data
// directory: the default limits of every tool call. Without it the
// defaults of Config apply (10 s, 256 MiB, 1 MiB of output, a 1 GiB write
// quota). docs/tools.md documents it.
const LimitsFile = "tools.json"

// limitsFile is the JSON of LimitsFile.
type limitsFile struct {
	// Limits are the defaults of every call. A tool's manifest may ask
	// for less, or for more where the user granted it (limit:KIND=VALUE).
	Limits capabilities.Limits `json:"limits"`
}

// ReadLimitsFile reads the default call limits from path (a LimitsFile);
// a missing file is no limits. Unknown fields and negative or impossible
// limits are errors naming the file.
func ReadLimitsFile(path string) (capabilities.Limits, error) {
	f, err := jsonfile.Read[limitsFile](path, "docs/tools.md")
	if err != nil {
		return capabilities.Limits{}, err
	}
	if err := f.Limits.Check(); err != nil {
		return capabilities.Limits{}, fmt.Errorf("%s: %w (see docs/tools.md)", path, err)
	}
	return f.Limits, nil
}

// WithDefaultLimits returns a copy of c whose call limits not set yet
// (by a command-line flag, say) are those of l.
func (c Config) WithDefaultLimits(l capabilities.Limits) Config {
	c.CallTimeout = cmp.Or(c.CallTimeout, time.Duration(l.TimeoutMS)*time.Millisecond)
	c.MemoryLimitMiB = cmp.Or(c.MemoryLimitMiB, int(l.MemoryMiB))
	c.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, int(l.OutputBytes))
	c.WriteQuotaBytes = cmp.Or(c.WriteQuotaBytes, l.WriteQuotaBytes)
	return c
}

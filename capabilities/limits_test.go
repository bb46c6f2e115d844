package capabilities

import (
	"errors"
	"testing"
)

func TestParseLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec  string
		value bool
		want  Limits
	}{
		{"timeout=30s", true, Limits{TimeoutMS: 30000}},
		{"timeout=2m", true, Limits{TimeoutMS: 120000}},
		{"memory=512MiB", true, Limits{MemoryMiB: 512}},
		{"memory=1GiB", true, Limits{MemoryMiB: 1024}},
		{"output=4MiB", true, Limits{OutputBytes: 4 << 20}},
		{"output=1000", true, Limits{OutputBytes: 1000}},
		{"write_quota=2GiB", true, Limits{WriteQuotaBytes: 2 << 30}},
		{"memory", false, Limits{MemoryMiB: 1}},
		{"timeout", false, Limits{TimeoutMS: 1}},
	} {
		got, err := ParseLimit(tc.spec, tc.value)
		if err != nil || got != tc.want {
			t.Errorf("ParseLimit(%q, %v) = %+v, %v; want %+v", tc.spec, tc.value, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		spec  string
		value bool
	}{
		{"memory=512", true},   // not whole MiB
		{"memory=8GiB", true},  // over 4 GiB
		{"memory=-1MiB", true}, // negative
		{"timeout=0s", true},   // zero
		{"timeout=soon", true}, // not a duration
		{"cpu=2", true},        // unknown
		{"memory", true},       // no value
		{"memory=1MiB", false}, // a value where a name is wanted
		{"output=1TiB", true},  // unknown unit
	} {
		if got, err := ParseLimit(tc.spec, tc.value); !errors.Is(err, ErrBadLimit) {
			t.Errorf("ParseLimit(%q, %v) = %+v, %v; want ErrBadLimit", tc.spec, tc.value, got, err)
		}
	}
}

func TestLimitsAddWithout(t *testing.T) {
	t.Parallel()
	l := Limits{TimeoutMS: 1000, MemoryMiB: 512}
	if got, want := l.Add(Limits{MemoryMiB: 1024, OutputBytes: 10}), (Limits{TimeoutMS: 1000, MemoryMiB: 1024, OutputBytes: 10}); got != want {
		t.Errorf("Add = %+v, want %+v", got, want)
	}
	if got, want := l.Without(Limits{MemoryMiB: 1}), (Limits{TimeoutMS: 1000}); got != want {
		t.Errorf("Without = %+v, want %+v", got, want)
	}
	g := Grants{Limits: Limits{MemoryMiB: 1}}
	if g.Empty() {
		t.Error("Grants with a limit is Empty")
	}
}

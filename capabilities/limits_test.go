package capabilities

import (
	"errors"
	"reflect"
	"strings"
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
	all := Limits{TimeoutMS: 1, MemoryMiB: 2, OutputBytes: 3, WriteQuotaBytes: 4}
	if got := (Limits{}).Add(all); got != all {
		t.Errorf("Add of every field = %+v, want %+v", got, all)
	}
	if got := all.Without(all); got != (Limits{}) {
		t.Errorf("Without of every field = %+v, want none", got)
	}
}

// TestLimitsFields: Check, Add and Without see every field of Limits,
// each under its JSON name.
func TestLimitsFields(t *testing.T) {
	t.Parallel()
	var l Limits
	typ := reflect.TypeOf(l)
	fields := l.fields()
	if typ.NumField() != len(fields) {
		t.Fatalf("Limits has %d fields, fields() lists %d", typ.NumField(), len(fields))
	}
	for i, f := range fields {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if f.name != name {
			t.Errorf("fields()[%d] = %s, want %s", i, f.name, name)
		}
		*f.v = -1
		if got := reflect.ValueOf(l).Field(i).Int(); got != -1 {
			t.Errorf("fields()[%d] does not point at %s", i, typ.Field(i).Name)
		}
		if err := l.Check(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Check with %s negative = %v, want an error naming it", name, err)
		}
		*f.v = 0
	}
}

package wasmtest_test

import (
	"context"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/keel-runtime/keel/internal/wasmtest"
)

// TestCannedReactor runs the module under wazero: keel_call returns the
// canned result's address and length, and memory holds the result there.
func TestCannedReactor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	const want = `{"words":3}`
	m, err := r.Instantiate(ctx, wasmtest.CannedReactor(want))
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.ExportedFunction("keel_call").Call(ctx, 1024, 5)
	if err != nil {
		t.Fatal(err)
	}
	ptr, n := uint32(res[0]>>32), uint32(res[0])
	got, ok := m.Memory().Read(ptr, n)
	if !ok || string(got) != want {
		t.Errorf("keel_call = %q at %d (%v), want %q", got, ptr, ok, want)
	}
}

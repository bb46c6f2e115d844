package policy

import "testing"

// TestLocks: Locks lists each lock of the managed layer by key, with
// where it is written; a policy without locks has none.
func TestLocks(t *testing.T) {
	t.Parallel()
	p, err := Compile(Options{}, LayerFile{Layer: LayerManaged, Name: "managed.json",
		Data: []byte("{\n  \"cloud\": false,\n  \"lock\": [\"default.egress\",\n    \"cloud\"]\n}\n")})
	if err != nil {
		t.Fatal(err)
	}
	got := p.Locks()
	if len(got) != 2 {
		t.Fatalf("Locks() = %v, want 2 locks", got)
	}
	want := []Setting{
		{Key: "cloud", Layer: LayerManaged, File: "managed.json", Line: 4, Col: 5},
		{Key: "default.egress", Layer: LayerManaged, File: "managed.json", Line: 3, Col: 12},
	}
	for i, w := range want {
		if *got[i] != w {
			t.Errorf("Locks()[%d] = %+v, want %+v", i, *got[i], w)
		}
	}
	empty, err := Compile(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(empty.Locks()); n != 0 {
		t.Errorf("Locks() of no files = %d locks, want 0", n)
	}
}

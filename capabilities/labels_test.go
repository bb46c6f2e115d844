package capabilities

import (
	"errors"
	"slices"
	"testing"

	"github.com/keel-runtime/keel"
)

func TestFSGrantLabels(t *testing.T) {
	f := FSGrant{HostPath: "/h", GuestPath: "/g", ReadOnly: true}
	g, err := f.WithLabels("secret", "private", "pii", "secret")
	if err != nil {
		t.Fatal(err)
	}
	if !g.Private || !slices.Equal(g.Labels, []string{"pii", "secret"}) {
		t.Errorf("WithLabels = %+v, want private and [pii secret]", g)
	}
	if f.Private || f.Labels != nil {
		t.Errorf("WithLabels modified its receiver: %+v", f)
	}
	if all := g.AllLabels(); !slices.Equal(all, []string{"pii", "private", "secret"}) {
		t.Errorf("AllLabels = %q", all)
	}
	if m := g.Modes(); !slices.Equal(m, []string{"ro", "private", "label:pii", "label:secret"}) {
		t.Errorf("Modes = %q", m)
	}
	if _, err := f.WithLabels("ok", "Not-OK"); !errors.Is(err, keel.ErrLabel) {
		t.Errorf("WithLabels(Not-OK) = %v, want keel.ErrLabel", err)
	}
	if f.Equal(g) || !g.Equal(g) {
		t.Error("Equal does not tell labelled grants apart")
	}
	// A grant written with "private" among its labels is private.
	if !(Grants{FS: []FSGrant{{Labels: []string{"private"}}}}).HasPrivate() {
		t.Error("HasPrivate ignores the label private")
	}
	// Clone and Add share no label slice with their source.
	gs := Grants{FS: []FSGrant{g}}
	c := gs.Clone()
	c.FS[0].Labels[0] = "changed"
	a := Grants{}.Add(gs)
	a.FS[0].Labels[1] = "changed"
	if !slices.Equal(gs.FS[0].Labels, []string{"pii", "secret"}) {
		t.Errorf("Clone or Add shared labels: %q", gs.FS[0].Labels)
	}
}

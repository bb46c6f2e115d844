package policy

import (
	"errors"
	"testing"
	"time"
)

func TestLabelSet(t *testing.T) { // not parallel: AllocsPerRun
	a := Labels(Private, PII, Private)
	if a.String() != "{pii,private}" || a.Len() != 2 || !a.Has(PII) || a.Has(Secret) {
		t.Errorf("Labels(private, pii, private) = %s", a)
	}
	b := Labels(Secret, "mail")
	u := a.Union(b)
	if u.String() != "{mail,pii,private,secret}" {
		t.Errorf("Union = %s, want {mail,pii,private,secret}", u)
	}
	if a.String() != "{pii,private}" || b.String() != "{mail,secret}" {
		t.Errorf("Union changed its operands: %s %s", a, b)
	}
	if got := u.Without(PII).Without("nope"); got.String() != "{mail,private,secret}" {
		t.Errorf("Without = %s", got)
	}
	if got := a.Union(Labels(PII)); !got.Equal(a) {
		t.Errorf("a ∪ subset = %s, want %s", got, a)
	}
	if n := testing.AllocsPerRun(100, func() { _ = a.Union(Labels()); _ = a.Union(a) }); n != 0 {
		t.Errorf("Union with a subset allocates %v times, want 0", n)
	}
	for _, s := range []string{"", "Private", "1x", "a b", string(make([]byte, 65))} {
		if _, err := ParseLabel(s); !errors.Is(err, ErrLabel) {
			t.Errorf("ParseLabel(%q) = %v, want ErrLabel", s, err)
		}
	}
	if l, err := ParseLabel("client-x_2"); err != nil || l != "client-x_2" {
		t.Errorf("ParseLabel(client-x_2) = %q, %v", l, err)
	}
}

// TestContext follows labels through a run: they join as data enters,
// stay on everything derived from the context, and leave only by an
// explicit, recorded declassification.
func TestContext(t *testing.T) {
	t.Parallel()
	var c Context
	c = c.Add(Labels(Private))    // a file from a private grant
	c = c.Add(LabelSet{})         // a tool result with no labels
	summary := c.Add(Labels(PII)) // a summary of the context, with a pii message
	if !summary.Labels().Has(Private) || !summary.Labels().Has(PII) {
		t.Fatalf("summary labels = %s, want private and pii", summary.Labels())
	}
	if _, err := summary.Declassify(Declassification{Label: Private, By: "ada"}); !errors.Is(err, ErrDeclassification) {
		t.Errorf("Declassify without a reason = %v, want ErrDeclassification", err)
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	d, err := summary.Declassify(Declassification{Label: Private, By: "ada", Reason: "the notes are public now", At: at})
	if err != nil {
		t.Fatal(err)
	}
	if d.Labels().Has(Private) || !d.Labels().Has(PII) {
		t.Errorf("after declassifying private: %s, want {pii}", d.Labels())
	}
	if log := d.Declassifications(); len(log) != 1 || log[0].By != "ada" || log[0].Reason == "" || !log[0].At.Equal(at) {
		t.Errorf("Declassifications = %+v", log)
	}
	if !summary.Labels().Has(Private) || len(summary.Declassifications()) != 0 {
		t.Errorf("Declassify changed its receiver: %s", summary.Labels())
	}
	if again := d.Add(Labels(Private)); !again.Labels().Has(Private) {
		t.Errorf("new private data after a declassification: %s, want private back", again.Labels())
	}
}

package replies

import "testing"

func TestAllows(t *testing.T) {
	in, err := Parse("_INBOX., _INBOX_orch.")
	if err != nil {
		t.Fatal(err)
	}
	for reply, want := range map[string]bool{
		"_INBOX.abc.1":                  true,
		"_INBOX_orch.x":                 true,
		"_INBOX.":                       false, // no token below the prefix
		"_INBOX.a..b":                   false,
		"_INBOX.a.":                     false,
		"":                              false,
		"prompt.composed.e.t":           false,
		"deadletter.x":                  false,
		"$KV.TEMPLATES.x":               false,
		"_INBOXES.x":                    false, // a longer token, not below the prefix
		"_INBOX_orchestra.x":            false,
		"x._INBOX.y":                    false,
		"$JS.API.STREAM.DELETE.PROMPTS": false,
	} {
		if got := in.Allows(reply); got != want {
			t.Errorf("Allows(%q) = %v, want %v", reply, got, want)
		}
	}
}

func TestParseRefusesWhatIsNotAPrefix(t *testing.T) {
	for _, list := range []string{"", " , ", "_INBOX", "_INBOX.>", "*.", "a b.", "."} {
		if _, err := Parse(list); err == nil {
			t.Errorf("Parse(%q) took it", list)
		}
	}
}

package service

import (
	"strings"
	"testing"
)

func TestCheckNATSURLs(t *testing.T) {
	for _, tt := range []struct {
		list, wantErr string
	}{
		{"nats://127.0.0.1:4222", ""},
		{"tls://nats.example:4443, ws://h:8080", ""},
		{"127.0.0.1:4222", ""}, // host:port, as nats.go accepts it
		{"nats://user:s3cret@h:4222,nats://h2:4222", ""},
		{"garbage", `"garbage" is neither`},
		{"http://user:s3cret@h:4222", `"http://user:xxxxx@h:4222" is not a nats://`},
		{"", "must not be empty"},
	} {
		err := checkNATSURLs(tt.list)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("checkNATSURLs(%q) = %v, want %q", tt.list, err, tt.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("checkNATSURLs(%q) printed the password: %v", tt.list, err)
		}
	}
}

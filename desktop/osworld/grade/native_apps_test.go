package grade

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/cdp/cdptest"
)

// appsEnv is a nativeEnv whose guest ports are the given test servers'.
func appsEnv(t *testing.T, guest Guest, vlc, devtools string) *nativeEnv {
	t.Helper()
	port := func(u string) int {
		if u == "" {
			return 0
		}
		_, p, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(p)
		return n
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	return &nativeEnv{guest: guest, cacheDir: t.TempDir(), now: time.Now, guestHTTP: client,
		ports: Env{Host: "127.0.0.1", VLCPort: port(vlc), ChromiumPort: port(devtools)}}
}

func getterCfg(t *testing.T, jsonText string) *pyDict {
	t.Helper()
	v, err := decodePy([]byte(jsonText))
	if err != nil {
		t.Fatal(err)
	}
	return v.(*pyDict)
}

// fakeVLC serves /requests/status.xml as VLC's HTTP interface does, behind
// basic auth with an empty user; the first `starting` requests find it not
// listening yet (503).
type fakeVLC struct {
	mu       sync.Mutex
	starting int
	requests int
	password string
}

func (v *fakeVLC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.requests++
	if v.starting > 0 {
		v.starting--
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	if user, pw, ok := r.BasicAuth(); !ok || user != "" || pw != v.password {
		w.Header().Set("WWW-Authenticate", `Basic realm="VLC stream"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if r.URL.Path != "/requests/status.xml" {
		http.NotFound(w, r)
		return
	}
	w.Write([]byte(vlcStatusXML("playing", "tone.wav")))
}

func TestVLCPlayingInfo(t *testing.T) {
	t.Run("answers after starting", func(t *testing.T) {
		vlc := &fakeVLC{starting: 2, password: "password"}
		srv := httptest.NewServer(vlc)
		defer srv.Close()
		env := appsEnv(t, nil, srv.URL, "")
		got, err := getVLCPlayingInfo(context.Background(), env, getterCfg(t, `{"type":"vlc_playing_info","dest":"status.xml"}`))
		if err != nil {
			t.Fatal(err)
		}
		if got != filepath.Join(env.cacheDir, "status.xml") {
			t.Fatalf("path = %v, want the cache's status.xml", got)
		}
		data, err := os.ReadFile(got.(string))
		if err != nil || string(data) != vlcStatusXML("playing", "tone.wav") {
			t.Errorf("status.xml = %q, %v", data, err)
		}
		if vlc.requests != 3 {
			t.Errorf("%d requests, want 3 (two while VLC started)", vlc.requests)
		}
	})
	t.Run("wrong password is None after five tries", func(t *testing.T) {
		vlc := &fakeVLC{password: "secret"}
		srv := httptest.NewServer(vlc)
		defer srv.Close()
		got, err := getVLCPlayingInfo(context.Background(), appsEnv(t, nil, srv.URL, ""), getterCfg(t, `{"dest":"status.xml"}`))
		if err != nil || got != nil {
			t.Errorf("got %v, %v; want None", got, err)
		}
		if vlc.requests != vlcStatusTries {
			t.Errorf("%d requests, want %d", vlc.requests, vlcStatusTries)
		}
	})
	t.Run("no dest", func(t *testing.T) {
		_, err := getVLCPlayingInfo(context.Background(), appsEnv(t, nil, "http://127.0.0.1:1", ""), getterCfg(t, `{}`))
		var pe *PythonError
		if !errors.As(err, &pe) || pe.Type != "KeyError" {
			t.Errorf("err = %v, want KeyError", err)
		}
	})
	t.Run("no VLC port", func(t *testing.T) {
		_, err := getVLCPlayingInfo(context.Background(), appsEnv(t, nil, "", ""), getterCfg(t, `{"dest":"s.xml"}`))
		if err == nil || !strings.Contains(err.Error(), "vlc=PORT") {
			t.Errorf("err = %v, want one naming the missing VLC port", err)
		}
	})
}

func TestHomeConfigGetters(t *testing.T) {
	expand := func(rel string) []string {
		return []string{"python3", "-c", "import os; print(os.path.expanduser('~/" + rel + "'))"}
	}
	g := newFakeGuest(t)
	g.setCommand(expand(".config/vlc/vlcrc"), false, "/home/user/.config/vlc/vlcrc\n")
	g.setCommand(expand(".config/GIMP/2.10/gimprc"), false, "/home/user/.config/GIMP/2.10/gimprc\n")
	g.setCommand(expand(".config/GIMP/2.10/sessionrc"), false, "/home/user/.config/GIMP/2.10/sessionrc\n")
	g.setCommand(expand(".config/GIMP/2.10/none"), false, "/home/user/.config/GIMP/2.10/none\n")
	g.setFile("/home/user/.config/vlc/vlcrc", "[qt]\nqt-bgcone=0\n")
	g.setFile("/home/user/.config/GIMP/2.10/gimprc", "(show-tooltips no)\n")
	g.setFile("/home/user/.config/GIMP/2.10/sessionrc", "")
	env := appsEnv(t, g.client(t), "", "")

	for _, tt := range []struct {
		name   string
		get    nativeGetter
		cfg    string
		want   string // content of the file handed on; "" for None
		raises string
	}{
		{"vlc_config", getVLCConfig, `{"dest":"vlcrc"}`, "[qt]\nqt-bgcone=0\n", ""},
		{"gimp_config_file", getGIMPConfigFile, `{"file_name":"gimprc","dest":"gimprc"}`, "(show-tooltips no)\n", ""},
		{"gimp_config_file empty", getGIMPConfigFile, `{"file_name":"sessionrc","dest":"sessionrc"}`, "", ""},
		{"gimp_config_file missing", getGIMPConfigFile, `{"file_name":"none","dest":"none"}`, "", ""},
		{"gimp_config_file without file_name", getGIMPConfigFile, `{"dest":"x"}`, "", "KeyError"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.get(context.Background(), env, getterCfg(t, tt.cfg))
			if tt.raises != "" {
				var pe *PythonError
				if !errors.As(err, &pe) || pe.Type != tt.raises {
					t.Fatalf("err = %v, want %s", err, tt.raises)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if got != nil {
					t.Fatalf("got %v, want None", got)
				}
				return
			}
			data, err := os.ReadFile(got.(string))
			if err != nil || string(data) != tt.want {
				t.Errorf("file = %q, %v; want %q", data, err, tt.want)
			}
		})
	}

	t.Run("vlc_config missing raises as OSWorld's write(None)", func(t *testing.T) {
		empty := newFakeGuest(t)
		empty.setCommand(expand(".config/vlc/vlcrc"), false, "/home/user/.config/vlc/vlcrc\n")
		_, err := getVLCConfig(context.Background(), appsEnv(t, empty.client(t), "", ""), getterCfg(t, `{"dest":"vlcrc"}`))
		var pe *PythonError
		if !errors.As(err, &pe) || pe.Type != "TypeError" {
			t.Errorf("err = %v, want TypeError", err)
		}
	})
}

func TestOpenTabsInfo(t *testing.T) {
	b := cdptest.New(t)
	b.SetTabs("file:///home/user/pages/one.html", "https://example.com/")
	got, err := getOpenTabsInfo(context.Background(), appsEnv(t, nil, "", b.URL), getterCfg(t, `{"type":"open_tabs_info"}`))
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, tab := range got.([]any) {
		u, _ := tab.(*pyDict).get("url")
		title, _ := tab.(*pyDict).get("title")
		if title == nil {
			t.Errorf("tab %v has no title", u)
		}
		urls = append(urls, u.(string))
	}
	if diff := cmp.Diff([]string{"file:///home/user/pages/one.html", "https://example.com/"}, urls); diff != "" {
		t.Errorf("tab URLs (-want +got):\n%s", diff)
	}

	t.Run("no browser is an empty list", func(t *testing.T) {
		got, err := getOpenTabsInfo(context.Background(),
			appsEnv(t, nil, "", "http://127.0.0.1:"+strconv.Itoa(closedPort(t))), getterCfg(t, `{}`))
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := got.([]any); !ok || len(l) != 0 {
			t.Errorf("got %#v, want []", got)
		}
	})
}

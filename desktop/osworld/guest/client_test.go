package guest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/desktop/osworld/guest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorded is one request as the guest saw it.
type recorded struct {
	Method, Path, ContentType string
	JSON                      any
	Form                      map[string]string
	File                      string
}

// recorder is a fake guest that records requests and answers 200 with
// answer.
func recorder(t *testing.T, answer string) (*guest.Client, func() []recorded) {
	t.Helper()
	var mu sync.Mutex
	var got []recorded
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := recorded{Method: r.Method, Path: r.URL.Path}
		ct := r.Header.Get("Content-Type")
		rec.ContentType, _, _ = strings.Cut(ct, ";")
		switch rec.ContentType {
		case "application/json":
			if err := json.NewDecoder(r.Body).Decode(&rec.JSON); err != nil {
				t.Errorf("%s: body is not JSON: %v", r.URL.Path, err)
			}
		case "multipart/form-data":
			if err := r.ParseMultipartForm(1 << 20); err != nil {
				t.Errorf("%s: %v", r.URL.Path, err)
			}
			rec.Form = map[string]string{}
			for k, v := range r.MultipartForm.Value {
				rec.Form[k] = v[0]
			}
			for k, fh := range r.MultipartForm.File {
				f, _ := fh[0].Open()
				b, _ := io.ReadAll(f)
				f.Close()
				rec.File = k + "=" + fh[0].Filename + ":" + string(b)
			}
		case "application/x-www-form-urlencoded":
			if err := r.ParseForm(); err != nil {
				t.Errorf("%s: %v", r.URL.Path, err)
			}
			rec.Form = map[string]string{}
			for k, v := range r.PostForm {
				rec.Form[k] = v[0]
			}
		}
		mu.Lock()
		got = append(got, rec)
		mu.Unlock()
		io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	c, err := guest.New(srv.URL, guest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c, func() []recorded {
		mu.Lock()
		defer mu.Unlock()
		return append([]recorded(nil), got...)
	}
}

// TestRequestShapes checks that every call sends exactly what OSWorld's
// server reads.
func TestRequestShapes(t *testing.T) {
	ctx := context.Background()
	const execAnswer = `{"status":"success","output":"","error":"","returncode":0}`
	tests := []struct {
		name   string
		answer string
		call   func(c *guest.Client) error
		want   recorded
	}{
		{"run pyautogui", execAnswer, func(c *guest.Client) error {
			_, err := c.RunPyautogui(ctx, "pyautogui.click(10, 20)")
			return err
		}, recorded{Method: "POST", Path: "/execute", ContentType: "application/json", JSON: map[string]any{
			"command": []any{"python", "-c", "import pyautogui; import time; pyautogui.FAILSAFE = False; pyautogui.click(10, 20)"},
			"shell":   false,
		}}},
		{"execute shell line", execAnswer, func(c *guest.Client) error {
			_, err := c.Execute(ctx, guest.ShellLine("echo hi | wc -c"))
			return err
		}, recorded{Method: "POST", Path: "/execute", ContentType: "application/json", JSON: map[string]any{
			"command": "echo hi | wc -c", "shell": true,
		}}},
		{"setup execute", execAnswer, func(c *guest.Client) error {
			_, err := c.SetupExecute(ctx, guest.Argv("mkdir", "-p", "/tmp/x"))
			return err
		}, recorded{Method: "POST", Path: "/setup/execute", ContentType: "application/json", JSON: map[string]any{
			"command": []any{"mkdir", "-p", "/tmp/x"}, "shell": false,
		}}},
		{"execute with verification", execAnswer, func(c *guest.Client) error {
			_, err := c.ExecuteWithVerification(ctx, guest.Argv("gedit"), guest.Verification{
				WindowExists: "gedit", MaxWait: 5 * time.Second, CheckInterval: 500 * time.Millisecond})
			return err
		}, recorded{Method: "POST", Path: "/setup/execute_with_verification", ContentType: "application/json", JSON: map[string]any{
			"command": []any{"gedit"}, "shell": false, "verification": map[string]any{"window_exists": "gedit"},
			"max_wait_time": 5.0, "check_interval": 0.5,
		}}},
		{"launch", "launched", func(c *guest.Client) error {
			return c.Launch(ctx, guest.Argv("google-chrome", "--remote-debugging-port=1337"))
		}, recorded{Method: "POST", Path: "/setup/launch", ContentType: "application/json", JSON: map[string]any{
			"command": []any{"google-chrome", "--remote-debugging-port=1337"}, "shell": false,
		}}},
		{"open file", "ok", func(c *guest.Client) error {
			return c.OpenFile(ctx, "/home/user/a.xlsx")
		}, recorded{Method: "POST", Path: "/setup/open_file", ContentType: "application/json", JSON: map[string]any{
			"path": "/home/user/a.xlsx", "timeout_seconds": 115.0,
		}}},
		{"activate window", "ok", func(c *guest.Client) error {
			return c.ActivateWindow(ctx, guest.Window{Name: "a.xlsx - LibreOffice Calc", Strict: true})
		}, recorded{Method: "POST", Path: "/setup/activate_window", ContentType: "application/json", JSON: map[string]any{
			"window_name": "a.xlsx - LibreOffice Calc", "strict": true, "by_class": false,
		}}},
		{"close window", "ok", func(c *guest.Client) error {
			return c.CloseWindow(ctx, guest.Window{Name: "gimp", ByClass: true})
		}, recorded{Method: "POST", Path: "/setup/close_window", ContentType: "application/json", JSON: map[string]any{
			"window_name": "gimp", "strict": false, "by_class": true,
		}}},
		{"change wallpaper", "ok", func(c *guest.Client) error {
			return c.ChangeWallpaper(ctx, "/home/user/w.png")
		}, recorded{Method: "POST", Path: "/setup/change_wallpaper", ContentType: "application/json", JSON: map[string]any{
			"path": "/home/user/w.png",
		}}},
		{"upload", "File Uploaded", func(c *guest.Client) error {
			return c.Upload(ctx, "/home/user/Desktop/a b.txt", strings.NewReader("hello"), 5)
		}, recorded{Method: "POST", Path: "/setup/upload", ContentType: "multipart/form-data",
			Form: map[string]string{"file_path": "/home/user/Desktop/a b.txt"}, File: "file_data=a b.txt:hello"}},
		{"file", "content", func(c *guest.Client) error {
			_, err := c.File(ctx, "~/x.txt")
			return err
		}, recorded{Method: "POST", Path: "/file", ContentType: "application/x-www-form-urlencoded",
			Form: map[string]string{"file_path": "~/x.txt"}}},
		{"screen size", `{"width":1920,"height":1080}`, func(c *guest.Client) error {
			_, _, err := c.ScreenSize(ctx)
			return err
		}, recorded{Method: "POST", Path: "/screen_size"}},
		{"accessibility", `{"AT":"<desktop-frame/>"}`, func(c *guest.Client) error {
			_, err := c.Accessibility(ctx)
			return err
		}, recorded{Method: "GET", Path: "/accessibility"}},
		{"terminal", `{"output":null,"status":"success"}`, func(c *guest.Client) error {
			_, _, err := c.Terminal(ctx)
			return err
		}, recorded{Method: "GET", Path: "/terminal"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, got := recorder(t, tt.answer)
			if err := tt.call(c); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]recorded{tt.want}, got()); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

func pngOf(t *testing.T, w, h int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewRGBA(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestScreenshotChecksPNG(t *testing.T) {
	img := pngOf(t, 7, 5)
	tests := []struct {
		name      string
		body      []byte
		wantW     int
		wantH     int
		wantError error
	}{
		{"png", img, 7, 5, nil},
		{"jpeg magic", []byte("\xff\xd8\xff\xe0 not a png"), 0, 0, guest.ErrBadResponse},
		{"truncated png", img[:20], 0, 0, guest.ErrBadResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write(tt.body)
			}))
			defer srv.Close()
			c, _ := guest.New(srv.URL, guest.Options{})
			shot, err := c.Screenshot(context.Background())
			if !errors.Is(err, tt.wantError) {
				t.Fatalf("error = %v, want %v", err, tt.wantError)
			}
			if shot.Width != tt.wantW || shot.Height != tt.wantH {
				t.Errorf("size = %dx%d, want %dx%d", shot.Width, shot.Height, tt.wantW, tt.wantH)
			}
		})
	}
}

// hangingListener accepts connections and never answers, as a QEMU forward
// does before the guest listens.
func hangingListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return "http://" + ln.Addr().String()
}

func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

func TestErrorClassification(t *testing.T) {
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"status":"error","message":"boom"}`)
	}))
	defer failing.Close()
	missing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"File not found"}`)
	}))
	defer missing.Close()
	hang := hangingListener(t)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name         string
		url          string
		ctx          context.Context
		notReady     bool
		timeout      bool
		status       int
		notFound     bool
		callerGaveUp bool
	}{
		{"refused", refusedURL(t), context.Background(), true, false, 0, false, false},
		{"silent forward", hang, context.Background(), true, true, 0, false, false},
		{"guest failed", failing.URL, context.Background(), false, false, 500, false, false},
		{"not found", missing.URL, context.Background(), false, false, 404, true, false},
		{"caller cancelled", hang, cancelled, false, false, 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := guest.New(tt.url, guest.Options{Timeouts: guest.Timeouts{Query: 200 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = c.Terminal(tt.ctx)
			var ge *guest.Error
			if !errors.As(err, &ge) {
				t.Fatalf("error %v (%T) is not a *guest.Error", err, err)
			}
			got := []any{guest.IsNotReady(err), errors.Is(err, guest.ErrTimeout), ge.Status,
				errors.Is(err, guest.ErrNotFound), errors.Is(err, context.Canceled)}
			want := []any{tt.notReady, tt.timeout, tt.status, tt.notFound, tt.callerGaveUp}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[not ready, timeout, status, not found, caller gave up] (-want +got):\n%s\nerror: %v", diff, err)
			}
			if ge.Op != "terminal" || !strings.HasPrefix(ge.URL, tt.url) {
				t.Errorf("error names op %q url %q; want terminal at %s", ge.Op, ge.URL, tt.url)
			}
		})
	}
}

func TestVerificationFailed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"status":"verification_failed","output":"out","error":"","returncode":0,"verification":"failed","wait_time":1}`)
	}))
	defer srv.Close()
	c, _ := guest.New(srv.URL, guest.Options{})
	res, err := c.ExecuteWithVerification(context.Background(), guest.Argv("true"), guest.Verification{CommandSuccess: "false"})
	if !errors.Is(err, guest.ErrVerificationFailed) {
		t.Fatalf("error = %v, want ErrVerificationFailed", err)
	}
	if res.Output != "out" {
		t.Errorf("output = %q, want the command's output kept", res.Output)
	}
}

func TestWaitReady(t *testing.T) {
	t.Run("silent forward times out", func(t *testing.T) {
		c, _ := guest.New(hangingListener(t), guest.Options{})
		err := c.WaitReady(context.Background(), 100*time.Millisecond, 600*time.Millisecond)
		if !errors.Is(err, guest.ErrTimeout) || !guest.IsNotReady(err) {
			t.Fatalf("error = %v, want a not-ready timeout", err)
		}
	})
	t.Run("ready after failures", func(t *testing.T) {
		img := pngOf(t, 3, 3)
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) <= 3 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.Write(img)
		}))
		defer srv.Close()
		c, _ := guest.New(srv.URL, guest.Options{})
		if err := c.WaitReady(context.Background(), time.Second, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := calls.Load(); got != 4 {
			t.Errorf("calls = %d, want 4 (3 failures, then ready)", got)
		}
	})
	t.Run("caller cancels", func(t *testing.T) {
		c, _ := guest.New(refusedURL(t), guest.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := c.WaitReady(ctx, time.Second, time.Minute)
		if !errors.Is(err, context.Canceled) || errors.Is(err, guest.ErrTimeout) {
			t.Fatalf("error = %v, want context.Canceled only", err)
		}
	})
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:5000", "ftp://x", "http://"} {
		if _, err := guest.New(u, guest.Options{}); err == nil {
			t.Errorf("New(%q) = nil error, want one", u)
		}
	}
}

package setup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"legato/rl/desktop/osworld/cdp"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/internal/backoff"
)

// dialBrowser connects to the guest's browser, waiting for it to answer: the
// step before usually just launched it.
func (c *Controller) dialBrowser(ctx context.Context) (*cdp.Conn, error) {
	if c.Browser == nil {
		return nil, errors.New("chrome step needs Controller.Browser (the debugging endpoint)")
	}
	wait := orDefault(c.BrowserWait, DefaultBrowserWait)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for tries := 1; ; tries++ {
		tryCtx, cancelTry := context.WithTimeout(wctx, 5*time.Second)
		conn, err := c.Browser.Dial(tryCtx)
		cancelTry()
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if backoff.Sleep(wctx, 500*time.Millisecond) != nil {
			return nil, fmt.Errorf("browser at %s did not answer within %v (%d tries): %w", c.Browser.Endpoint(), wait, tries, err)
		}
	}
}

// openTabs opens each URL in a new tab, then closes the tab the browser
// started with, as OSWorld's chrome_open_tabs does. Pages load in the
// background; the step does not wait for them.
func (c *Controller) openTabs(ctx context.Context, p openTabsParams) error {
	conn, err := c.dialBrowser(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	before, err := conn.Tabs(ctx)
	if err != nil {
		return err
	}
	for i, u := range p.URLs {
		if _, err := conn.OpenTab(ctx, u); err != nil {
			return fmt.Errorf("open tab %s: %w", u, err)
		}
		if i == 0 && len(before) > 0 {
			if err := conn.CloseTab(ctx, before[0].TargetID); err != nil {
				return fmt.Errorf("close the first tab: %w", err)
			}
		}
	}
	return nil
}

// closeTabs closes, for each URL, the first tab showing it (compared as
// OSWorld's compare_urls does). Like OSWorld, a URL no tab shows is skipped.
func (c *Controller) closeTabs(ctx context.Context, p closeTabsParams) error {
	conn, err := c.dialBrowser(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, u := range p.URLs {
		tabs, err := conn.Tabs(ctx)
		if err != nil {
			return err
		}
		found := false
		for _, t := range tabs {
			if cdp.SameURL(t.URL, u) {
				if err := conn.CloseTab(ctx, t.TargetID); err != nil {
					return fmt.Errorf("close tab %s: %w", u, err)
				}
				found = true
				break
			}
		}
		if !found {
			c.logger().Warn("no tab to close", "url", u)
		}
	}
	return nil
}

// historyScript fills a Chrome history database in the guest: argv[1] is
// its path, argv[2] the visits as JSON [[url, title, chrome time], ...].
// It runs in the guest so the host needs no SQLite.
const historyScript = `import json, os, sqlite3, sys
path = os.path.expandvars(os.path.expanduser(sys.argv[1]))
con = sqlite3.connect(path)
for url, title, t in json.loads(sys.argv[2]):
    cur = con.execute("INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden) VALUES (?, ?, 1, 0, ?, 0)", (url, title, t))
    con.execute("INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, visit_duration) VALUES (?, ?, 0, 805306368, 0, 0)", (cur.lastrowid, t))
con.commit()
con.close()
st = os.stat(os.path.dirname(path))
try:
    os.chown(path, st.st_uid, st.st_gid)
except OSError:
    pass
`

// unixInChromeTime is where Unix time starts in Chrome's time, which
// counts microseconds from 1601-01-01 UTC.
const unixInChromeTime = 11_644_473_600 * 1_000_000

// chromeTime converts t to Chrome's history timestamp, as OSWorld does:
// (t - datetime(1601, 1, 1)).total_seconds() * 1e6. Not t.Sub(1601): a
// time.Duration ends after 292 years, and such a visit lands in 1893,
// where Chrome's address bar never suggests it.
func chromeTime(t time.Time) int64 {
	return t.UnixMicro() + unixInChromeTime
}

// updateHistory replaces the guest's Chrome history with OSWorld's empty
// history database holding the given visits, as OSWorld's
// update_browse_history does (visit times count back from now, in UTC).
func (c *Controller) updateHistory(ctx context.Context, p historyParams) error {
	if c.Downloads == nil {
		return errors.New("update_browse_history step needs Controller.Downloads")
	}
	tmplURL := c.HistoryTemplateURL
	if tmplURL == "" {
		tmplURL = DefaultHistoryTemplateURL
	}
	dest := c.HistoryPath
	if dest == "" {
		dest = DefaultHistoryPath
	}
	local, err := c.Downloads.Fetch(ctx, tmplURL)
	if err != nil {
		return err
	}
	if err := c.Guest.UploadFile(ctx, dest, local); err != nil {
		return err
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	at := now().UTC()
	rows := make([][]any, len(p.History))
	for i, h := range p.History {
		visit := at.Add(-time.Duration(*h.FromNow * float64(time.Second)))
		rows[i] = []any{h.URL, h.Title, chromeTime(visit)}
	}
	raw, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	res, err := c.Guest.SetupExecute(ctx, guest.Argv("python3", "-c", historyScript, dest, string(raw)))
	if err != nil {
		return err
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("filling the history database failed (exit %d): %s", res.ReturnCode, res.Error)
	}
	return nil
}

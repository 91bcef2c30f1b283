package cdp

import (
	"net"
	"regexp"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// SameURL reports whether two URLs name the same page as OSWorld's
// compare_urls (metrics/utils.py) decides it, which both its
// chrome_close_tabs setup step and its is_expected_tabs metric use: a URL
// without "scheme://" is taken as http; the scheme's case, the host's case,
// its port and user, its public suffix and a lone "www" label do not count;
// a path of "/" equals none; params, query and fragment must match exactly.
//
// The public suffix comes from golang.org/x/net/publicsuffix, the ICANN
// section only, as tldextract (OSWorld's library) reads it by default.
func SameURL(a, b string) bool {
	return normalizeURL(a) == normalizeURL(b)
}

// pageURL is a URL split as Python's urllib.parse.urlparse splits it, with
// the host reduced as compare_urls reduces it.
type pageURL struct {
	scheme, host, path, params, query, fragment string
}

var hasScheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+\-.]*://`)

func normalizeURL(s string) pageURL {
	if !hasScheme.MatchString(s) {
		s = "http://" + s
	}
	u := splitURL(s)
	u.host = pageHost(strings.ToLower(u.host))
	if u.path == "/" {
		u.path = ""
	}
	return u
}

// splitURL is urlparse for a string known to start with "scheme://":
// urlparse drops tabs and newlines and leading blanks, lowers the scheme,
// takes the netloc up to the first of "/?#", then the fragment, the query,
// and for the schemes that have them the params of the last path segment.
func splitURL(s string) pageURL {
	s = strings.TrimLeft(s, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"+
		"\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f ")
	s = strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(s)
	var u pageURL
	i := strings.Index(s, "://")
	u.scheme, s = strings.ToLower(s[:i]), s[i+3:]
	end := strings.IndexAny(s, "/?#")
	if end < 0 {
		end = len(s)
	}
	u.host, s = s[:end], s[end:]
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s, u.fragment = s[:i], s[i+1:]
	}
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s, u.query = s[:i], s[i+1:]
	}
	u.path = s
	if usesParams[u.scheme] && strings.Contains(s, ";") {
		from := 0
		if j := strings.LastIndexByte(s, '/'); j >= 0 {
			from = j
		}
		if i := strings.IndexByte(s[from:], ';'); i >= 0 {
			u.path, u.params = s[:from+i], s[from+i+1:]
		}
	}
	return u
}

// usesParams is urllib.parse.uses_params.
var usesParams = map[string]bool{"": true, "ftp": true, "hdl": true, "prospero": true, "http": true,
	"imap": true, "https": true, "shttp": true, "rtsp": true, "rtspu": true, "sip": true, "sips": true,
	"mms": true, "sftp": true, "tel": true}

// pageHost is the host compare_urls keeps of a netloc: tldextract's
// subdomain and domain (user, port and public suffix gone), without a
// subdomain that is just "www".
func pageHost(netloc string) string {
	if i := strings.LastIndexByte(netloc, '@'); i >= 0 {
		netloc = netloc[i+1:]
	}
	if strings.HasPrefix(netloc, "[") {
		if i := strings.IndexByte(netloc, ']'); i >= 0 {
			return netloc[1:i] // an IPv6 address is its own domain
		}
	}
	host, _, _ := strings.Cut(netloc, ":")
	host = strings.Trim(host, ".")
	if host == "" || net.ParseIP(host) != nil {
		return host
	}
	labels := strings.Split(host, ".")
	n := suffixStart(labels)
	domain, sub := "", ""
	if n >= 1 {
		domain = labels[n-1]
	}
	if n >= 2 {
		sub = strings.Join(labels[:n-1], ".")
	}
	if sub == "" || sub == "www" {
		return domain
	}
	return sub + "." + domain
}

// suffixStart returns the index of the first label of the longest ICANN
// public suffix of labels, or len(labels) when there is none (an unlisted
// top-level name such as "localhost").
func suffixStart(labels []string) int {
	for i := range labels {
		cand := strings.Join(labels[i:], ".")
		if ps, icann := publicsuffix.PublicSuffix(cand); icann && ps == cand {
			return i
		}
	}
	return len(labels)
}

package export

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"image"
	"image/png"
	"slices"
	"strings"
	"testing"

	"legato/rl/schema"
)

// TestTokenRuns: the runs of the image token in ids given as chunks, runs
// crossing chunks and empty chunks included, are those in the ids as one
// slice.
func TestTokenRuns(t *testing.T) {
	const tok = 7
	tests := []struct {
		ids  []int64
		want [][2]int
	}{
		{nil, nil},
		{[]int64{1, 2, 3}, nil},
		{[]int64{7}, [][2]int{{0, 1}}},
		{[]int64{1, 7, 7, 7, 2, 7, 7}, [][2]int{{1, 4}, {5, 7}}},
		{[]int64{7, 7, 1, 1, 7, 1}, [][2]int{{0, 2}, {4, 5}}},
	}
	for _, tt := range tests {
		if got := tokenRuns([][]int64{tt.ids}, tok); !slices.Equal(got, tt.want) {
			t.Errorf("tokenRuns(%v) = %v, want %v", tt.ids, got, tt.want)
		}
		// Cut into chunks of every size, with empty ones between.
		for size := 1; size <= len(tt.ids); size++ {
			var chunks [][]int64
			for c := range slices.Chunk(tt.ids, size) {
				chunks = append(chunks, c, nil)
			}
			if got := tokenRuns(chunks, tok); !slices.Equal(got, tt.want) {
				t.Errorf("tokenRuns(%v in chunks of %d) = %v, want %v", tt.ids, size, got, tt.want)
			}
		}
	}
}

// TestPNGSize: a PNG's header gives its size as image/png decodes it;
// anything else is refused, saying why.
func TestPNGSize(t *testing.T) {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewNRGBA(image.Rect(0, 0, 1366, 7))); err != nil {
		t.Fatal(err)
	}
	good := b.Bytes()
	w, h, err := pngSize(good[:pngHeadBytes])
	if err != nil || w != 1366 || h != 7 {
		t.Errorf("pngSize = %d, %d, %v; want 1366, 7", w, h, err)
	}
	// withIHDR returns good with IHDR's data changed by edit and its CRC
	// made to match.
	withIHDR := func(edit func(data []byte)) []byte {
		p := slices.Clone(good[:pngHeadBytes])
		edit(p[16:29])
		binary.BigEndian.PutUint32(p[29:33], crc32.ChecksumIEEE(p[12:29]))
		return p
	}
	tests := []struct {
		name string
		head []byte
		want string
	}{
		{"short", good[:20], "not a PNG: 20 bytes"},
		{"jpeg", append([]byte("\xff\xd8\xff\xe0"), good[4:pngHeadBytes]...), "not a PNG: no PNG signature"},
		{"no IHDR", append(slices.Clone(good[:12]), append([]byte("IDAT"), good[16:pngHeadBytes]...)...), "not a 13-byte IHDR"},
		{"bad CRC", append(slices.Clone(good[:pngHeadBytes-1]), good[pngHeadBytes-1]^1), "checksum does not match"},
		{"zero width", withIHDR(func(d []byte) { binary.BigEndian.PutUint32(d[0:4], 0) }), "damaged PNG: size 0x7"},
		{"huge height", withIHDR(func(d []byte) { binary.BigEndian.PutUint32(d[4:8], 1<<31) }), "damaged PNG: size 1366x2147483648"},
	}
	for _, tt := range tests {
		if _, _, err := pngSize(tt.head); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v; want an error saying %q", tt.name, err, tt.want)
		}
	}
}

// TestImageURLs: the image URLs read from a stored message's JSON are those
// decoding it gives, and a URL that is not read as it is written is left
// to decoding.
func TestImageURLs(t *testing.T) {
	ref := schema.ImageScheme + strings.Repeat("ab", 32)
	tests := []struct {
		msg    schema.Message
		direct bool // read without decoding
	}{
		{schema.Message{Role: "system", Content: []schema.Part{schema.TextPart("no image")}}, true},
		{schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart(ref)}}, true},
		{schema.Message{Role: "user", Content: []schema.Part{
			schema.TextPart(`a text that says "image_url":{"url":"legato-image://00"} and \ too`),
			schema.ImagePart(ref), schema.TextPart("between"), schema.ImagePart(schema.ImageScheme + strings.Repeat("cd", 32)),
		}}, true},
		{schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart("https://example.com/a.png")}}, true},
		{schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart("https://example.com/a.png?x=1&y=<2>")}}, false},
		{schema.Message{Role: "user", Content: []schema.Part{schema.ImagePart(`https://example.com/"quoted"`)}}, false},
	}
	for i, tt := range tests {
		canon, err := json.Marshal(tt.msg)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, p := range tt.msg.Content {
			if p.ImageURL != nil {
				want = append(want, p.ImageURL.URL)
			}
		}
		got, ok := imageURLs(canon)
		if ok != tt.direct || (ok && !slices.Equal(got, want)) {
			t.Errorf("message %d: %q, %v; want %q, %v", i, got, ok, want, tt.direct)
		}
	}
}

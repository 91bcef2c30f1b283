package schema

// Message is one chat message of a prompt, in the OpenAI chat-completions
// shape. Images are parts whose ImageURL is a data URL in memory and a
// legato-image://<sha256> reference on disk.
type Message struct {
	Role    string `json:"role"`
	Content []Part `json:"content"`
}

// Part is one piece of a message's content: text or an image.
type Part struct {
	Type     string    `json:"type"` // "text" or "image_url"
	Text     string    `json:"text,omitempty"`
	ImageURL *ImageURL `json:"image_url,omitempty"`
}

// ImageURL holds an image as a URL.
type ImageURL struct {
	URL string `json:"url"`
}

// ImageScheme prefixes references to images in a run's image store.
const ImageScheme = "legato-image://"

// TextPart returns a text part.
func TextPart(s string) Part { return Part{Type: "text", Text: s} }

// ImagePart returns an image part with the given URL.
func ImagePart(url string) Part { return Part{Type: "image_url", ImageURL: &ImageURL{URL: url}} }

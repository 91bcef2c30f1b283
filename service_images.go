package rl

import "legato/rl/export"

// The images of a result's steps are listed by package export, which an
// export's samples list them with, so that the two cannot disagree.

// DefaultImageTokenID is the token id a Qwen2-VL, Qwen2.5-VL or Qwen3-VL
// processor expands each image into (<|image_pad|>), repeated once per
// merged patch: the runs of it in a prompt's ids are its images' spans.
const DefaultImageTokenID = export.DefaultImageTokenID

// StepImage is one image of a step's prompt, in the order the prompt holds
// them (export.StepImage).
type StepImage = export.StepImage

package view

import (
	"fmt"
	"math"
)

// shape is a mark as the attempt page draws it in the SVG over the
// screenshot, in the screenshot's pixels: a dot at the point (a click, the
// end of a drag), a ring around it (double and triple clicks), a path (a
// drag's line, a scroll's arrow) and a label.
type shape struct {
	Kind        string
	X, Y, R, SW float64
	Dot         bool
	Ring        float64
	Path        string
	Label       string
	LX, LY, FS  float64
	TSW         float64
}

// shapesOf draws the marks that have a point; r is the dot's radius, from
// the screenshot's size.
func shapesOf(marks []Mark, r float64) []shape {
	var out []shape
	for _, m := range marks {
		if !m.At {
			continue
		}
		s := shape{Kind: m.Kind, X: round2(m.X), Y: round2(m.Y), R: round2(r), SW: round2(r / 4), FS: round2(2.2 * r), TSW: round2(r / 3)}
		s.LX, s.LY = round2(m.X+1.4*r), round2(m.Y-1.2*r)
		switch m.Kind {
		case "click":
			s.Dot = true
		case "double":
			s.Dot, s.Ring, s.Label = true, round2(1.8*r), "2×"
		case "triple":
			s.Dot, s.Ring, s.Label = true, round2(1.8*r), "3×"
		case "right":
			s.Dot, s.Label = true, "R"
		case "middle":
			s.Dot, s.Label = true, "M"
		case "move":
			s.Ring = round2(r)
		case "drag":
			s.Dot = true
			if m.From {
				s.Path = fmt.Sprintf("M%g %g L%g %g", round2(m.X0), round2(m.Y0), s.X, s.Y)
			}
		case "scroll":
			// An arrow from the point, 6 radii long, the way the page moves
			// under the wheel's direction.
			l := 6 * r
			ex, ey := m.X+float64(m.DX)*l, m.Y+float64(m.DY)*l
			hx, hy := float64(m.DX)*1.5*r, float64(m.DY)*1.5*r
			s.Path = fmt.Sprintf("M%g %g L%g %g M%g %g L%g %g L%g %g", s.X, s.Y, round2(ex), round2(ey),
				round2(ex-hx-hy), round2(ey-hy+hx), round2(ex), round2(ey), round2(ex-hx+hy), round2(ey-hy-hx))
			s.Ring = round2(r)
		default:
			s.Dot = true
		}
		out = append(out, s)
	}
	return out
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// curve is one storm's certificates and errors in each second.
type curve struct {
	label string
	certs []uint64
	errs  []uint64
}

// curveColors are the colors of the storms' lines, in order.
var curveColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// plotStorms draws the goodput curves of the storms (certificates issued
// in each second, solid; refusals, dashed) as a PNG at path.
func plotStorms(path string, ztunnels, identities int, curves []curve) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Cold-start storm: %d ztunnels × %d identities", ztunnels, identities)
	p.X.Label.Text = "second of the storm"
	p.Y.Label.Text = "per second"
	p.Y.Min = 0
	p.Legend.Top = true
	for i, c := range curves {
		col := curveColors[i%len(curveColors)]
		issued, err := plotter.NewLine(perSecond(c.certs))
		if err != nil {
			return err
		}
		issued.Color, issued.Width = col, vg.Points(1.5)
		p.Add(issued)
		p.Legend.Add(c.label+": certificates", issued)
		if sum(c.errs) == 0 {
			continue
		}
		refused, err := plotter.NewLine(perSecond(c.errs))
		if err != nil {
			return err
		}
		refused.Color, refused.Width, refused.Dashes = col, vg.Points(1), []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(refused)
		p.Legend.Add(c.label+": errors", refused)
	}
	p.Add(plotter.NewGrid())
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Legend.ThumbnailWidth = vg.Points(20)
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}

// perSecond places each second's count at its end.
func perSecond(counts []uint64) plotter.XYs {
	xy := make(plotter.XYs, len(counts))
	for i, n := range counts {
		xy[i] = plotter.XY{X: float64(i + 1), Y: float64(n)}
	}
	return xy
}

func sum(v []uint64) uint64 {
	var n uint64
	for _, x := range v {
		n += x
	}
	return n
}

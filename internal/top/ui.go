package top

import (
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// Source takes samples.
type Source func() (Sample, error)

type tickMsg time.Time

type sampleMsg struct {
	s   Sample
	err error
}

// model is the interactive view: it samples every interval and shows
// the frame between the last two samples.
type model struct {
	src      Source
	interval time.Duration
	rows     int
	prev     *Sample
	frame    string
	paused   bool
	err      error
}

// NewProgram returns the interactive terminal program: q quits, space
// pauses.
func NewProgram(src Source, interval time.Duration, rows int) *tea.Program {
	return tea.NewProgram(&model{src: src, interval: interval, rows: rows, frame: "sampling..."}, tea.WithAltScreen())
}

func (m *model) sample() tea.Cmd {
	return func() tea.Msg {
		s, err := m.src()
		return sampleMsg{s, err}
	}
}

func (m *model) tick() tea.Cmd {
	return tea.Tick(m.interval, func(t time.Time) tea.Msg { return tickMsg(t) })
}

func (m *model) Init() tea.Cmd { return m.sample() }

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case " ":
			m.paused = !m.paused
		}
		return m, nil
	case tickMsg:
		return m, m.sample()
	case sampleMsg:
		if msg.err != nil {
			m.err = msg.err
			return m, tea.Quit
		}
		if m.prev != nil && !m.paused {
			m.frame = Render(Compute(*m.prev, msg.s, m.rows))
		}
		m.prev = &msg.s
		return m, m.tick()
	}
	return m, nil
}

func (m *model) View() string {
	footer := "\nq: quit  space: pause"
	if m.paused {
		footer += "  (paused)"
	}
	return m.frame + footer + "\n"
}

// Err is the sampling error that ended the program, if any.
func Err(p tea.Model) error {
	if m, ok := p.(*model); ok {
		return m.err
	}
	return nil
}

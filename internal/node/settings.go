package node

import (
	"fmt"

	"github.com/socklane/socklane/internal/datapath"
)

// checkAdopted refuses settings the user gave that an adopted datapath
// was not loaded with: its programs hold their settings until unloaded,
// and attaching it anyway would silently run other settings than asked.
func checkAdopted(dp *datapath.Datapath, want datapath.Settings, given []string) error {
	if !dp.Adopted() || len(given) == 0 {
		return nil
	}
	have, err := dp.Settings()
	if err != nil {
		return fmt.Errorf("--%s: the settings of the datapath running in %s cannot be read to compare (%w): "+
			"leave the settings flags out to use it as it is, or run `socklane down` and load it again", given[0], dp.PinDir(), err)
	}
	if d, ok := have.Differs(want, given); ok {
		return fmt.Errorf("--%s %s: the datapath running in %s was loaded with --%s %s, and a datapath keeps its settings until it is unloaded: "+
			"leave the flag out to use it as it is, or run `socklane down` and load it again with the new setting", d.Name, d.Want, dp.PinDir(), d.Name, d.Have)
	}
	return nil
}

"""`python -m k2back.testing`: re-run the tolerance calibration (see TOLERANCES)."""

import json

from k2back.testing import calibrate

print(json.dumps(calibrate(), indent=1))

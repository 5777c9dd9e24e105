"""`wmrl calibrate-twin --logs DIR`: fit the digital twin's parameters to logged robot episodes (CMA-ES). The fit is
`real_robot.calibration`."""

from real_robot.calibration import CalibrateConfig, calibrate

__all__ = ["CalibrateConfig", "calibrate"]

"""`wmrl calibrate-twin --logs DIR`: fit the digital twin's parameters to logged robot episodes (CMA-ES). The fit is
`real_robot.calibration`."""

from real_robot.calibration import CalibrateConfig, calibrate


def calibrate_twin(cfg: CalibrateConfig) -> dict:
    return {k: v for k, v in calibrate(cfg).items() if k != "curve"}  # the curve is in the run folder


__all__ = ["CalibrateConfig", "calibrate_twin"]

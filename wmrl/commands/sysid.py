"""`wmrl sysid --out DIR`: record system-identification episodes (joint sweeps, pushes) on the sim-real arm for
`wmrl calibrate-twin`."""

from real_robot.calibration import SysIdConfig, record_sysid

__all__ = ["SysIdConfig", "record_sysid"]

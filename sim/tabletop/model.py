"""Hand-written MJCF of the tabletop cell. The arm's geometry and kinematics live in `wmrl.core.arm`, where the
deployment side reads them without the simulator; they are re-exported here for the simulator's modules."""

from __future__ import annotations

from wmrl.core.arm import (BASE_HEIGHT, FINGER_MAX, HAND_DROP, JOINT_HIGH, JOINT_LOW, L1, L2,  # noqa: F401
                           SHOULDER_Z, TABLE_Z, WORKSPACE_HIGH, WORKSPACE_LOW, forward_kinematics, inverse_kinematics)

MJCF = """
<mujoco model="wmrl_tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.002" integrator="implicitfast" cone="elliptic" impratio="10"/>
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <global offwidth="640" offheight="480"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.2 0.2 0.2" specular="0 0 0"/>
  </visual>
  <default>
    <joint armature="0.01"/>
    <geom condim="4"/>
    <default class="arm">
      <geom contype="0" conaffinity="0" rgba="0.75 0.75 0.78 1"/>
    </default>
    <default class="finger">
      <geom type="box" size="0.006 0.005 0.025" rgba="0.2 0.2 0.22 1" friction="1.5 0.02 0.001"
            contype="1" conaffinity="1" condim="6" solref="0.005 1"/>
    </default>
  </default>
  <asset>
    <texture name="grid" type="2d" builtin="checker" rgb1="0.55 0.45 0.35" rgb2="0.5 0.41 0.32" width="64" height="64"/>
    <material name="table" texture="grid" texrepeat="6 6"/>
  </asset>
  <worldbody>
    <light name="key" pos="0.4 0.2 1.2" dir="0 -0.15 -1" diffuse="0.7 0.7 0.7" castshadow="false"/>
    <geom name="floor" type="plane" size="2 2 0.1" pos="0 0 -0.75" rgba="0.3 0.3 0.32 1" contype="0" conaffinity="0"/>
    <geom name="table" type="box" size="0.45 0.45 0.02" pos="0.35 0 -0.02" material="table" friction="0.6 0.005 0.0001"/>
    <body name="look_target" pos="0.42 0 0.02"/>
    <camera name="front" pos="0.95 0.0 0.6" mode="targetbody" target="look_target" fovy="40"/>
    <geom name="zone_yellow" type="cylinder" size="0.05 0.001" pos="0.4 0.2 0.001" contype="0" conaffinity="0"/>
    <geom name="zone_purple" type="cylinder" size="0.05 0.001" pos="0.4 -0.2 0.001" contype="0" conaffinity="0"/>
    <body name="cube_red" pos="0.4 0 0.02"><freejoint name="cube_red"/>
      <geom name="cube_red" type="box" size="0.02 0.02 0.02" mass="0.05"/></body>
    <body name="cube_green" pos="0.4 0.1 0.02"><freejoint name="cube_green"/>
      <geom name="cube_green" type="box" size="0.02 0.02 0.02" mass="0.05"/></body>
    <body name="cube_blue" pos="0.4 -0.1 0.02"><freejoint name="cube_blue"/>
      <geom name="cube_blue" type="box" size="0.02 0.02 0.02" mass="0.05"/></body>
    <body name="base" pos="0 0 0">
      <geom class="arm" type="cylinder" size="0.07 0.05" pos="0 0 0.05" rgba="0.25 0.25 0.28 1"/>
      <body name="link0" pos="0 0 {base}" gravcomp="1">
        <joint name="yaw" axis="0 0 1" range="-1.6 1.6" damping="4"/>
        <geom class="arm" type="cylinder" size="0.05 0.025" pos="0 0 0.025"/>
        <body name="upper" pos="0 0 {shoulder_off}" gravcomp="1">
          <joint name="shoulder" axis="0 1 0" range="-1.2 1.6" damping="4"/>
          <geom class="arm" type="capsule" fromto="0 0 0 0 0 {l1}" size="0.028"/>
          <body name="fore" pos="0 0 {l1}" gravcomp="1">
            <joint name="elbow" axis="0 1 0" range="-0.5 2.8" damping="3"/>
            <geom class="arm" type="capsule" fromto="0 0 0 {l2} 0 0" size="0.022"/>
            <body name="hand" pos="{l2} 0 0" gravcomp="1">
              <joint name="wrist" axis="0 1 0" range="-2.8 2.8" damping="2"/>
              <geom class="arm" type="capsule" fromto="0 0 0 0 0 -0.07" size="0.018"/>
              <geom class="arm" name="palm" type="box" size="0.015 0.05 0.01" pos="0 0 -0.08" rgba="0.3 0.3 0.33 1"/>
              <camera name="wrist" pos="-0.06 0 -0.04" xyaxes="0 -1 0 0.89 0 0.45" fovy="80"/>
              <site name="ee" pos="0 0 -{drop}" size="0.005" rgba="1 0 0 0"/>
              <body name="finger_left" pos="0 0.005 -0.11" gravcomp="1">
                <joint name="finger_left" type="slide" axis="0 1 0" range="0 {fmax}" damping="2"/>
                <geom class="finger" name="finger_left"/>
              </body>
              <body name="finger_right" pos="0 -0.005 -0.11" gravcomp="1">
                <joint name="finger_right" type="slide" axis="0 -1 0" range="0 {fmax}" damping="2"/>
                <geom class="finger" name="finger_right"/>
              </body>
            </body>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <position name="yaw" joint="yaw" kp="300" ctrlrange="-1.6 1.6"/>
    <position name="shoulder" joint="shoulder" kp="600" ctrlrange="-1.2 1.6"/>
    <position name="elbow" joint="elbow" kp="400" ctrlrange="-0.5 2.8"/>
    <position name="wrist" joint="wrist" kp="150" ctrlrange="-2.8 2.8"/>
    <position name="finger_left" joint="finger_left" kp="300" ctrlrange="0 {fmax}" forcerange="-12 12"/>
    <position name="finger_right" joint="finger_right" kp="300" ctrlrange="0 {fmax}" forcerange="-12 12"/>
  </actuator>
  <contact>
    <exclude body1="finger_left" body2="finger_right"/>
  </contact>
</mujoco>
""".format(
    base=BASE_HEIGHT, shoulder_off=SHOULDER_Z - BASE_HEIGHT, l1=L1, l2=L2, drop=HAND_DROP, fmax=FINGER_MAX
)

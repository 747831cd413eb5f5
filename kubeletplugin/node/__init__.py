"""What the plugin says about its node: ResourceSlices, node events, classic capacity, MIG mode.

- ``inventory`` — this node's MIG inventory (device names ⇄ GPUs and placements);
- ``publisher`` — the inventory published as ResourceSlices, kept right as the GPUs change;
- ``capacity`` — classic resources of a turned-off shim kept out of the Node's status;
- ``events`` — events on this Node for what an operator must see;
- ``migmode`` — ``--mig-mode when-idle``: MIG mode turned on at start where it is off;
- ``setup`` — the GPU backend the flags choose, and the node prepared before the plugin starts.
"""

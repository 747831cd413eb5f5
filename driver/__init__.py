"""The domain core shared by the controller and the kubelet plugin."""

"""Classic ``nvidia.com/mig-<profile>: N`` requests, allocated as claims.

- ``shadow`` — the shadow ResourceClaims that stand for a classic pod's requests;
- ``release`` — releasing them once their pod finished or is gone.
"""

"""The rented host, from this side of SSH: the connection with a one-time key, the onstart script and its
dead-man switch (and the check that it is armed), the GPUs that arrived read and matched with the offer, the
bundle uploaded and the artifacts pulled back.

What runs on the host itself is `remote/`, shipped there as files in the bundle and never imported here.
"""

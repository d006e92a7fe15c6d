"""``python -m healer_dev.k8s_emulator``: serve the emulator until interrupted."""

from healer_dev.k8s_emulator.server import main

main()

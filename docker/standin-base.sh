#!/bin/sh
# A stand-in for the official python:3.11-slim-bookworm image, for building and testing
# the Dockerfile where no image registry is reachable (tests/integration/test_docker.py):
# Debian bookworm (minbase) from a Debian mirror, Python 3.11 at /usr/local as the
# official image has it (python, python3, pip there), and the given CA bundle in the
# trust store, so that pip and apt inside a build trust what this machine trusts.
#
#   docker/standin-base.sh ROOTFS_DIR MIRROR CA_BUNDLE   (as root; needs debootstrap)
#
# then `tar -C ROOTFS_DIR -c . | docker import - NAME` (the test does both).
set -eu
root=$1
mirror=$2
bundle=$3

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror"
# The official image's layout: its own Python under /usr/local. A venv there gives the
# same commands (python, python3, pip) and installs packages under /usr/local.
chroot "$root" /usr/bin/python3 -m venv /usr/local
# Kept in /usr/local/share/ca-certificates so that update-ca-certificates, which the
# Dockerfile's apt-get may run (ca-certificates-java), keeps it in the bundle.
install -m 644 "$bundle" "$root/usr/local/share/ca-certificates/machine-bundle.crt"
chroot "$root" update-ca-certificates >/dev/null
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb

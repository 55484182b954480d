#!/bin/sh
# Makes secrets/ for compose.yaml: a random operator API token, key passphrase and
# database password, each readable only by the user that reads it (compose bind-mounts
# the files as they are): fleet-server's user in the image, and postgres (uid 999) for
# its password. Keeps the secrets that already exist. Run as root.
set -eu
cd "$(dirname "$0")"
image=${IMAGE:-edgefleet-server:0.1.0}
engine=${ENGINE:-docker}
label=$("$engine" image inspect --format '{{index .Config.Labels "org.edgefleet.user"}}' "$image")
uid=${label#* }
uid=${uid%%:*}
umask 077
mkdir -p secrets
gen() { [ -s "secrets/$1" ] || head -c 32 /dev/urandom | base64 | tr -d '/+=\n' > "secrets/$1"; }
gen EDGEFLEET_API_TOKEN
gen EDGEFLEET_KEY_PASSPHRASE
gen postgres_password
printf 'postgres:5432:edgefleet:edgefleet:%s\n' "$(cat secrets/postgres_password)" > secrets/pgpass
chmod 600 secrets/*
chown "$uid" secrets/EDGEFLEET_API_TOKEN secrets/EDGEFLEET_KEY_PASSPHRASE secrets/pgpass
chown 999 secrets/postgres_password
echo "secrets/ written (fleet-server reads as uid $uid, postgres as uid 999)"

#!/usr/bin/env bash
# An OpenSSH bundle for the H100 machine, which has no sshd and no package registry (issue 18's check,
# bench/gpu/ssh.sh): this machine's sshd, ssh and ssh-keygen with the shared libraries they need
# (all but glibc's own, which the GPU machine has in a newer version), and wrappers that run them with
# those libraries. Run on the development machine; it writes .gpu/ssh/ (git-ignored, carried with .gpu).
# On the GPU machine: PATH=$PWD/.gpu/ssh/path:$PATH KREFINE_SSHD=$PWD/.gpu/ssh/path/sshd bench/gpu/ssh.sh run
set -euo pipefail
cd "$(dirname "$0")/../.."
K=.gpu/ssh
rm -rf "$K"
mkdir -p "$K/bin" "$K/lib" "$K/path"
for tool in /usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen; do
  cp "$tool" "$K/bin/"
  # glibc's libraries stay the GPU machine's own (it has a newer glibc); everything else travels.
  ldd "$tool" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$K/lib/" ;;
    esac
  done
done
for tool in sshd ssh ssh-keygen; do
  # sshd re-executes itself by its absolute path: the wrapper hands it one, and the library path
  # stays in its environment (a login session gets a fresh environment from sshd, not this one).
  cat > "$K/path/$tool" <<WRAP
#!/bin/sh
here=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/bin/$tool" "\$@"
WRAP
  chmod +x "$K/path/$tool"
done
du -sh "$K"

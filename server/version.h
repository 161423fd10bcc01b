/*
 * version.h - the daemon's version, reported by --version and Health.
 */
#ifndef TOPOSD_VERSION_H
#define TOPOSD_VERSION_H

#define TOPOSD_VERSION "0.1.0"

#endif /* TOPOSD_VERSION_H */

/*
 * version.h - the daemon's version, reported by --version and Health:
 * the engine's (topos.h), one number for the whole project.
 */
#ifndef TOPOSD_VERSION_H
#define TOPOSD_VERSION_H

#include "topos.h"

#define TOPOSD_VERSION TOPOS_VERSION

#endif /* TOPOSD_VERSION_H */

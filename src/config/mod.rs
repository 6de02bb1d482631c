//! Felix's configuration (reference §3): the parameter table, its sources (defaults < config file
//! < environment < ConfigUpdate) and Felix's parsing rules. Never touches the kernel.

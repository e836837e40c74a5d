// Package testca makes throwaway certificate authorities, keys and
// ztunnel-shaped certificate signing requests for tests of the ca and server
// packages. It is test support only: keys are generated per call, nothing is
// cached, and every failure stops the test.
package testca
